"""Experiments: the typed run configuration, its plan and the one runner (simulated or live).

- ``config``: ``RunConfig`` (every sim and live field, defaults, checks), ``Variant``;
- ``workload``: the requests of one seed;
- ``units``: the plan (variants × seeds × routers) as units, and the one body that runs a unit;
- ``backends``: where units run: ``SimBackend`` (here, a process pool or Ray) or ``LiveBackend`` (live servers);
- ``runner``: ``run_experiment`` (units on a backend's executor, written in unit order), ``simulate``.

A run is written through every run through ``lbbench.rundir``, the one writer and reader of run directories.
"""

from .config import LEARNED_ROUTERS, WORKLOADS, ConfigError, RunConfig, Variant, workload_label
from .runner import RunOutcome, default_out_dir, run_experiment, simulate
from .units import Reporter, Unit, UnitOutput, Work, plan, plan_all, run_columns, works
from .workload import annotated_requests, build_requests

__all__ = [
    "LEARNED_ROUTERS", "WORKLOADS", "ConfigError", "Reporter", "RunConfig", "RunOutcome", "Unit", "UnitOutput",
    "Variant", "Work", "annotated_requests", "build_requests", "default_out_dir", "plan", "plan_all", "run_columns",
    "run_experiment", "simulate", "workload_label", "works",
]
