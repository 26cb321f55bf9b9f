"""Experiments: the typed run configuration, its plan, the one runner (simulated or live) and the run directory.

- ``config``: ``RunConfig`` (every sim and live field, defaults, checks), ``Variant``;
- ``workload``: the requests of one seed;
- ``runner``: the plan (variants × seeds × routers) on ``SimBackend`` or ``LiveBackend``, ``run_experiment``;
- ``parallel``: simulated units on an executor (process pool, Ray), written in unit order;
- ``rundir``: the one writer and reader of run directories.
"""

from .config import LEARNED_ROUTERS, WORKLOADS, ConfigError, RunConfig, Variant, workload_label
from .rundir import (RECORD_SCHEMA, RunDir, default_out_dir, read_run_toml, records_frame, timeline_frame,
                     to_json, write_run_toml)
from .runner import (Reporter, RunOutcome, Unit, iter_sim_runs, iter_units, plan, plan_all, run_columns,
                     run_experiment, sim_frames)
from .workload import build_requests

__all__ = [
    "LEARNED_ROUTERS", "RECORD_SCHEMA", "WORKLOADS", "ConfigError", "Reporter", "RunConfig", "RunDir",
    "RunOutcome", "Unit", "Variant", "build_requests", "default_out_dir", "iter_sim_runs",
    "iter_units", "plan", "plan_all", "read_run_toml", "records_frame", "run_columns", "run_experiment", "sim_frames",
    "timeline_frame", "to_json", "workload_label", "write_run_toml",
]
