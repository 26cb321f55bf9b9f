"""Regenerate the fixed run directories under ``tests/reports/data/``.

    python tests/reports/make_fixture.py

- ``v100/`` and ``a100/``: tiny *simulated* runs (4 instances, 200 paper-mix requests at
  20 req/s, routers round_robin / jsq / random, seeds 0 and 1, 1 s timeline) on the
  ``llama2-7b-v100`` and ``llama3.1-8b-a100`` profiles — the hardware comparison pair.
- ``live/``: a small *synthetic* live-style run (planned/actual send times, some failed
  requests) from ``lbbench.reports.synthetic``, until a recorded live run is small enough
  to commit.

The golden tables in ``golden/`` are computed from these files; after regenerating the
fixture, refresh them with ``LBBENCH_UPDATE_GOLDEN=1 pytest tests/reports``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

from lbbench.core import RECORD_FIELDS
from lbbench.profiles import load_profile
from lbbench.reports.synthetic import synthetic_requests, write_run
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads.paper_mix import paper_mix

DATA = Path(__file__).resolve().parent / "data"
ROUTERS = ("round_robin", "jsq", "random")
SEEDS = (0, 1)
NUM_REQUESTS = 200
RATE_PER_S = 20.0
NUM_INSTANCES = 4


def sim_run(profile_name: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    profile = load_profile(profile_name)
    frames, timelines = [], []
    for seed in SEEDS:
        reqs = paper_mix(NUM_REQUESTS, RATE_PER_S, seed)
        for name in ROUTERS:
            router = get_router(name, num_instances=NUM_INSTANCES, seed=seed, profile=profile)
            sim = ClusterSim(profile, NUM_INSTANCES, reqs, seed=seed, run_id=f"fixture-{profile_name}",
                             timeline_interval_s=1.0)
            records = sim.run(router)
            frames.append(pl.DataFrame([r.as_dict() for r in records], infer_schema_length=None)
                          .select(RECORD_FIELDS))
            timelines.append(pl.DataFrame([
                {"router": name, "seed": seed, "time_s": s.time_s, "instance": s.instance,
                 "num_running": s.num_running, "num_waiting": s.num_waiting,
                 "kv_usage": s.kv_usage, "num_preemptions": s.num_preemptions}
                for s in sim.timeline]))
    df = pl.concat(frames, how="diagonal_relaxed").with_columns(
        profile=pl.lit(profile.name), workload=pl.lit("paper-mix"),
        num_instances=pl.lit(NUM_INSTANCES, pl.Int64), instance_scheduler=pl.lit("fcfs"),
        chunked_prefill=pl.lit(bool(profile.chunked_prefill)), order=pl.lit(None, pl.String),
        rate_per_s=pl.lit(RATE_PER_S), backend=pl.lit("sim"))
    return df, pl.concat(timelines)


def main() -> None:
    for sub, profile_name in (("v100", "llama2-7b-v100"), ("a100", "llama3.1-8b-a100")):
        shutil.rmtree(DATA / sub, ignore_errors=True)
        df, tl = sim_run(profile_name)
        write_run(DATA / sub, df, tl, note=f"tiny simulated run for report tests ({profile_name})")
        print(f"{sub}: {df.height} requests, {tl.height} timeline rows")
    shutil.rmtree(DATA / "live", ignore_errors=True)
    live = synthetic_requests(routers=("round_robin", "jsq"), seeds=(0,), num_requests=60,
                              rate_per_s=10.0, num_instances=2, profile="tiny-cpu", live=True,
                              fail_every=15, workload="trace:azure-conv-slice")
    write_run(DATA / "live", live)
    print(f"live: {live.height} requests")


if __name__ == "__main__":
    main()
