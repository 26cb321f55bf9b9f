"""Synthetic request tables for tests and demos of the reports (not a simulator).

Records are plausible, not simulated: per request, arrival <= dispatch <= first token <=
finish, with a per-router slowdown factor so that routers differ in a known direction.
Everything is seeded, so the same arguments give the same table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from ..rundir import write_run_doc, write_tables
from ..metrics.summary import summarize

#: Mean E2E multiplier per router (1.0 = round robin).
DEFAULT_SLOWDOWN = {"round_robin": 1.0, "jsq": 0.9, "random": 1.25, "min_min": 0.95}


def synthetic_requests(
    routers: Sequence[str] = ("round_robin", "jsq", "random"),
    seeds: Sequence[int] = (0, 1, 2),
    num_requests: int = 200,
    rate_per_s: float = 20.0,
    num_instances: int = 4,
    profile: str = "llama2-7b-v100",
    slowdown: dict[str, float] | None = None,
    chunked_prefill: bool = False,
    live: bool = False,
    fail_every: int = 0,
    noise: float = 0.05,
    workload: str = "paper-mix",
) -> pl.DataFrame:
    """A requests table in the ``requests.parquet`` layout."""
    slowdown = {**DEFAULT_SLOWDOWN, **(slowdown or {})}
    tasks = ("translation", "eli5", "imdb", "squad", "wnut")
    rows: list[dict] = []
    for seed in seeds:
        arr_rng = np.random.default_rng(seed)  # paired arrivals: same for every router
        arrivals = np.cumsum(arr_rng.exponential(1.0 / rate_per_s, num_requests))
        prompt = arr_rng.integers(10, 800, num_requests)
        output = arr_rng.integers(5, 600, num_requests)
        task_idx = arr_rng.integers(0, len(tasks), num_requests)
        for r_i, router in enumerate(routers):
            rng = np.random.default_rng(10_000 * (seed + 1) + r_i)
            f = slowdown.get(router, 1.0)
            for i in range(num_requests):
                a = float(arrivals[i])
                wait = float(rng.exponential(0.01))
                queue = f * float(rng.exponential(2.0)) * (1 + noise * rng.standard_normal()) ** 2
                prefill = 0.02 + 3e-4 * float(prompt[i])
                tbt = f * (0.03 + 0.01 * float(rng.random()))
                out = int(output[i])
                d = a + wait
                ft = d + queue + prefill
                fin = ft + tbt * (out - 1)
                failed = fail_every > 0 and i % fail_every == fail_every - 1
                rec = {
                    "run_id": f"{router}-s{seed}", "router": router, "seed": int(seed),
                    "request_id": i, "task": tasks[int(task_idx[i])],
                    "instance": (i % num_instances) if router == "round_robin"
                    else int(rng.integers(0, num_instances)),
                    "arrival_s": a, "dispatch_s": d, "first_token_s": ft,
                    "finish_s": None if failed else fin,
                    "prompt_tokens": int(prompt[i]), "output_tokens": out,
                    "generated_tokens": 0 if failed else out,
                    "predicted_output_tokens": None, "predicted_bucket": None,
                    "num_preemptions": int(rng.random() < 0.02 * f),
                    "tbt_mean_s": tbt, "tbt_p99_s": tbt * 1.5,
                    "tbt_max_s": tbt * 2 + prefill,
                    "planned_send_s": a if live else None,
                    "actual_send_s": a + abs(float(rng.normal(0, 2e-4))) if live else None,
                    "server_prompt_tokens": int(prompt[i]) if live else None,
                    "server_output_tokens": (0 if failed else out) if live else None,
                    "http_status": (500 if failed else 200) if live else None,
                    "error": "HTTP 500" if failed else None,
                }
                rows.append(rec)
    df = pl.DataFrame(rows, schema_overrides={
        "predicted_output_tokens": pl.Int64, "predicted_bucket": pl.Int64,
        "planned_send_s": pl.Float64, "actual_send_s": pl.Float64,
        "server_prompt_tokens": pl.Int64, "server_output_tokens": pl.Int64,
        "http_status": pl.Int64, "finish_s": pl.Float64, "error": pl.String})
    return df.with_columns(
        profile=pl.lit(profile), workload=pl.lit(workload),
        num_instances=pl.lit(num_instances, pl.Int64),
        instance_scheduler=pl.lit("fcfs"), chunked_prefill=pl.lit(chunked_prefill),
        order=pl.lit(None, pl.String), rate_per_s=pl.lit(rate_per_s),
        backend=pl.lit("live" if live else "sim"),
    )


def synthetic_timeline(requests: pl.DataFrame, step_s: float = 1.0) -> pl.DataFrame:
    """A ``timeline.parquet`` table derived from request rows: per router, seed, instance and
    sample time, how many requests run there, a KV usage proxy and preemptions so far."""
    rows: list[dict] = []
    for (router, seed), g in requests.partition_by(["router", "seed"], as_dict=True,
                                                   maintain_order=True).items():
        end = float(g["finish_s"].max() or g["arrival_s"].max())
        times = np.arange(0.0, end + step_s, step_s)
        for inst in sorted(g["instance"].unique().to_list()):
            h = g.filter(pl.col("instance") == inst)
            d = h["dispatch_s"].to_numpy()
            f = h["finish_s"].fill_null(end).to_numpy()
            ctx = (h["prompt_tokens"] + h["generated_tokens"]).to_numpy()
            pre = h["num_preemptions"].fill_null(0).to_numpy()
            for t in times:
                on = (d <= t) & (f > t)
                rows.append({"router": router, "seed": seed, "time_s": float(t), "instance": inst,
                             "num_running": int(on.sum()), "num_waiting": 0,
                             "kv_usage": float(min(1.0, ctx[on].sum() / 50_000)),
                             "num_preemptions": int(pre[f <= t].sum())})
    return pl.DataFrame(rows)


def write_run(path, requests: pl.DataFrame, timeline: pl.DataFrame | None = None,
              complete: bool = True, extra: dict | None = None,
              note: str = "synthetic run (reports test data, not a simulation)"):
    """Write a run directory (``requests.parquet``, ``summary.parquet``, ``run.toml`` and
    optionally ``timeline.parquet``) the way ``lbbench run`` lays it out."""
    out = Path(path)
    write_tables(out, requests, timeline, summarize(requests))
    first = requests.row(0, named=True)
    write_run_doc(out, {"note": note, "complete": complete,
                        "routers": requests["router"].unique(maintain_order=True).to_list(),
                        "seeds": sorted(requests["seed"].unique().to_list()),
                        "profile": first.get("profile", ""), "backend": first.get("backend", "sim"),
                        **(extra or {})})
    return out
