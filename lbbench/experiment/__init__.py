"""Experiments: the typed run configuration, its plan, the one runner (simulated or live) and the run directory.

- ``config``: ``RunConfig`` (every sim and live field, defaults, checks), ``Variant``;
- ``workload``: the requests of one seed;
- ``units``: the plan (variants × seeds × routers) as units, and the one body that runs a unit;
- ``backends``: where units run: ``SimBackend`` (here, a process pool or Ray) or ``LiveBackend`` (live servers);
- ``runner``: ``run_experiment`` (units on a backend's executor, written in unit order), ``simulate``;
- ``rundir``: the one writer and reader of run directories.
"""

from .config import LEARNED_ROUTERS, WORKLOADS, ConfigError, RunConfig, Variant, workload_label
from .rundir import (RECORD_SCHEMA, RunDir, default_out_dir, read_run_toml, records_frame, timeline_frame,
                     to_json, write_run_toml)
from .runner import RunOutcome, run_experiment, simulate
from .units import Reporter, Unit, UnitOutput, Work, plan, plan_all, run_columns, works
from .workload import build_requests

__all__ = [
    "LEARNED_ROUTERS", "RECORD_SCHEMA", "WORKLOADS", "ConfigError", "Reporter", "RunConfig", "RunDir",
    "RunOutcome", "Unit", "UnitOutput", "Variant", "Work", "build_requests", "default_out_dir", "plan", "plan_all",
    "read_run_toml", "records_frame", "run_columns", "run_experiment", "simulate", "timeline_frame", "to_json",
    "workload_label", "works", "write_run_toml",
]
