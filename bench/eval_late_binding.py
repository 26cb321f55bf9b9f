"""Evaluation of the late-binding router (``late_binding_srpt``) in the simulator.

Prints, per setting, paired-seed tables (mean E2E +- std over seeds, paired
improvement over round robin, p50/p99 E2E, preemptions per run, mean router
wait) for round robin, the paper's heuristics, lbbench's ``wgrl`` when a
checkpoint for the setting exists, and the late-binding router; plus the
aging-bound and KV-slack sweeps, a light-to-overload rate sweep and a
breakdown of where the time goes.

    python bench/eval_late_binding.py                    # every section, 10 seeds on the headline
    python bench/eval_late_binding.py --section paper --seeds 10 --jobs 2
    python bench/eval_late_binding.py --section sweep --seeds 3
    python bench/eval_late_binding.py --list

Sections: paper, aging, slack, scale, a100, azure, sweep, breakdown. The Azure
conversation trace is read from ``--trace`` (default: ``AzureLLMInferenceTrace_conv.csv``
next to the repository under ``shared/traces``) and replayed on the A100 profile
(its prompts, ~1.2k tokens on average, do not fit the V100 profile's 1536-token
cache beside their outputs).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from lbbench.experiment import RunConfig, build_requests
from lbbench.predict import annotate, load_predictor
from lbbench.profiles import load_profile
from lbbench.reports.summary import summarize
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim

#: Jain et al., first setup (Llama-2-7B, 4 x V100, paper mix, 20 req/s): workload-guided RL
PAPER_WGRL_PCT = 11.43
NAME = "late_binding_srpt"
SWEEP_MEAN = "hrrn, max_wait_s=600"
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


@dataclass(frozen=True)
class Cell:
    """One workload on one cluster (every router and seed of a table runs on it)."""

    profile: str = "llama2-7b-v100"
    instances: int = 4
    rate: float | None = 20.0
    requests: int = 2000
    predictor: str = "noisy:0.79"
    chunked: bool | None = None
    trace: str | None = None
    max_prompt_tokens: int | None = None


@dataclass(frozen=True)
class Arm:
    """A router under a label (the same router with other options is another arm)."""

    label: str
    router: str
    options: tuple[tuple[str, Any], ...] = ()


@dataclass
class Table:
    title: str
    cell: Cell
    arms: list[Arm]
    seeds: int
    note: str = ""
    rows: pl.DataFrame | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------- running


@lru_cache(maxsize=8)
def _requests(cell: Cell, seed: int):
    prof = load_profile(cell.profile)
    if cell.trace:
        from lbbench.workloads.traces import load_trace_requests

        reqs = load_trace_requests(cell.trace, rate=cell.rate, requests=cell.requests,
                                   max_prompt_tokens=cell.max_prompt_tokens, prompt_overflow="filter")
    else:
        cfg = RunConfig(profile=cell.profile, instances=cell.instances, rate_per_s=cell.rate,
                        requests=cell.requests, predictor=cell.predictor)
        reqs = build_requests(cfg, prof, seed, None)
    return annotate(reqs, load_predictor(cell.predictor, profile=prof, seed=0))


def run_one(cell: Cell, arm: Arm, seed: int) -> tuple[pl.DataFrame | None, str | None, float]:
    """One simulated run; returns (records, error message, wall seconds)."""
    prof = load_profile(cell.profile)
    try:
        router = get_router(arm.router, num_instances=cell.instances, seed=seed, profile=prof,
                            **dict(arm.options))
    except Exception as exc:  # a learned router without a checkpoint for this setting
        return None, f"{arm.label}: {exc}", 0.0
    t0 = time.perf_counter()
    sim = ClusterSim(prof, cell.instances, _requests(cell, seed), chunked_prefill=cell.chunked, seed=seed)
    recs = sim.run(router)
    wall = time.perf_counter() - t0
    df = pl.DataFrame([r.as_dict() for r in recs], infer_schema_length=None)
    return df.with_columns(pl.lit(arm.label).alias("router")), None, wall


def _job(args: tuple[Cell, Arm, int]) -> tuple[Cell, Arm, int, pl.DataFrame | None, str | None, float]:
    cell, arm, seed = args
    df, err, wall = run_one(cell, arm, seed)
    return cell, arm, seed, df, err, wall


def run_tables(tables: list[Table], jobs: int) -> None:
    work = [(t.cell, a, s) for t in tables for a in t.arms for s in range(t.seeds)]
    results: dict[tuple[Cell, str, int], tuple[pl.DataFrame | None, str | None, float]] = {}
    if jobs > 1:
        # spawn, not fork: a forked child can deadlock on locks held by polars' threads
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
            for cell, arm, seed, df, err, wall in ex.map(_job, work, chunksize=1):
                results[(cell, arm.label, seed)] = (df, err, wall)
    else:
        for w in work:
            cell, arm, seed, df, err, wall = _job(w)
            results[(cell, arm.label, seed)] = (df, err, wall)
    for t in tables:
        frames, notes = [], []
        for a in t.arms:
            got = [results[(t.cell, a.label, s)] for s in range(t.seeds)]
            errs = {e for _, e, _ in got if e}
            if errs:
                notes.append(sorted(errs)[0].split("\n")[0])
                continue
            frames.extend(df for df, _, _ in got)
            t.extra[a.label] = {"wall_s": float(np.mean([w for _, _, w in got])),
                                "makespan_s": float(np.mean([df["finish_s"].max() for df, _, _ in got]))}
        df = pl.concat(frames, how="diagonal_relaxed")
        t.rows = summarize(df, by=["router"])
        t.extra["_frames"] = df
        if notes:
            t.note = (t.note + " " if t.note else "") + "Skipped: " + "; ".join(notes)


# ---------------------------------------------------------------------------- printing


def _fmt(x: float | None, nd: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def print_table(t: Table) -> None:
    c = t.cell
    where = (f"trace {Path(c.trace).name}" if c.trace else "paper-mix") + (
        f" @ {c.rate:g} req/s" if c.rate else " @ own rate")
    chunk = "" if c.chunked is None else f", chunked prefill {'on' if c.chunked else 'off'}"
    print(f"\n### {t.title}\n")
    print(f"{c.instances} x {c.profile}, {where}, {c.requests} requests, predictor {c.predictor}{chunk}, "
          f"{t.seeds} paired seeds\n")
    print("| router | mean E2E (s) | vs RR | p50 E2E | p99 E2E | preemptions | router wait | makespan |")
    print("|---|---|---|---|---|---|---|---|")
    for row in t.rows.iter_rows(named=True):  # type: ignore[union-attr]
        ex = t.extra.get(row["router"], {})
        print(f"| {row['router']} | {_fmt(row['mean_e2e_s'])} ± {_fmt(row['mean_e2e_std_s'])} | "
              f"{_fmt(row['improvement_vs_round_robin_pct'])} % | {_fmt(row['p50_e2e_s'])} | "
              f"{_fmt(row['p99_e2e_s'])} | {_fmt(row['preemptions'], 0)} | {_fmt(row['mean_router_wait_s'])} | "
              f"{_fmt(ex.get('makespan_s'))} |")
    if t.note:
        print(f"\n{t.note}")


def print_breakdown(t: Table) -> None:
    """Where the time goes: router wait, waiting at the instance, decoding; by predicted size."""
    df = t.extra["_frames"].filter(pl.col("error").is_null())
    df = df.with_columns(
        wait=pl.col("dispatch_s") - pl.col("arrival_s"),
        queue=pl.col("first_token_s") - pl.col("dispatch_s"),
        decode=pl.col("finish_s") - pl.col("first_token_s"),
        e2e=pl.col("finish_s") - pl.col("arrival_s"),
        size=pl.when(pl.col("output_tokens") < 100).then(pl.lit("a: <100 tokens"))
        .when(pl.col("output_tokens") < 400).then(pl.lit("b: 100-399"))
        .otherwise(pl.lit("c: >=400")),
    )
    print(f"\n### {t.title}: where the time goes (mean seconds per request)\n")
    print("| router | output length | share | router wait | prefill wait at instance | decode | E2E | "
          "preemptions / request |")
    print("|---|---|---|---|---|---|---|---|")
    total = df.group_by("router").len().rename({"len": "n"})
    g = (df.group_by(["router", "size"]).agg(
        n=pl.len(), wait=pl.col("wait").mean(), queue=pl.col("queue").mean(), decode=pl.col("decode").mean(),
        e2e=pl.col("e2e").mean(), pre=pl.col("num_preemptions").mean())
         .join(total.rename({"n": "tot"}), on="router").sort(["router", "size"]))
    for r in g.iter_rows(named=True):
        print(f"| {r['router']} | {r['size'][3:]} | {100 * r['n'] / r['tot']:.0f} % | {_fmt(r['wait'])} | "
              f"{_fmt(r['queue'])} | {_fmt(r['decode'])} | {_fmt(r['e2e'])} | {_fmt(r['pre'], 2)} |")
    busy = (df.group_by(["router", "seed"])
            .agg(tps=pl.col("generated_tokens").sum() / (pl.col("finish_s").max() - pl.col("arrival_s").min()))
            .group_by("router").agg(tps=pl.col("tps").mean()).sort("router"))
    print("\n| router | generated tokens / s (cluster, first arrival to last finish) |")
    print("|---|---|")
    for r in busy.iter_rows(named=True):
        print(f"| {r['router']} | {r['tps']:.0f} |")


def print_sweep(tables: list[Table]) -> None:
    c = tables[0].cell
    print("\n### Rate sweep: light load to overload\n")
    print(f"{c.instances} x {c.profile}, paper-mix, {c.requests} requests, predictor {c.predictor}, "
          f"{tables[0].seeds} paired seeds; improvement = paired mean E2E gain over round robin "
          "(± std of the paired difference)\n")
    print("| rate (req/s) | router | mean E2E (s) | vs RR | p99 E2E (s) | preemptions | router wait (s) |")
    print("|---|---|---|---|---|---|---|")
    for t in tables:
        df = t.extra["_frames"].filter(pl.col("error").is_null())
        per = (df.group_by(["router", "seed"]).agg(m=(pl.col("finish_s") - pl.col("arrival_s")).mean())
               .pivot(on="router", index="seed", values="m"))
        for row in t.rows.iter_rows(named=True):  # type: ignore[union-attr]
            name = row["router"]
            sd = ""
            if name != "round_robin" and len(per) > 1:
                diff = (per["round_robin"] - per[name]).to_numpy()
                sd = f" ± {float(np.std(diff, ddof=1)):.2f} s"
            print(f"| {t.cell.rate:g} | {name} | {_fmt(row['mean_e2e_s'], 2)} | "
                  f"{_fmt(row['improvement_vs_round_robin_pct'])} %{sd} | {_fmt(row['p99_e2e_s'], 2)} | "
                  f"{_fmt(row['preemptions'], 0)} | {_fmt(row['mean_router_wait_s'], 2)} |")


# ---------------------------------------------------------------------------- sections


def _baselines(with_heuristics: bool = True) -> list[Arm]:
    arms = [Arm("round_robin", "round_robin")]
    if with_heuristics:
        arms += [Arm("jsq", "jsq"), Arm("min_min", "min_min"), Arm("wgrl", "wgrl")]
    return arms


def build_sections(seeds: int, trace: str) -> dict[str, list[Table]]:
    lb = Arm(NAME, NAME)
    few = max(1, min(seeds, 3))
    paper = [Table(f"Paper setup, predictor {p}", Cell(predictor=p), [*_baselines(), lb],
                   seeds if p == "noisy:0.79" else max(1, min(seeds, 5)),
                   note=f"Paper (Jain et al.): workload-guided RL {PAPER_WGRL_PCT} % over round robin on this setup.")
             for p in ("noisy:0.79", "oracle", "bucket_oracle")]
    aging = [Table("Release order and aging bound vs mean and p99", Cell(),
                   [Arm("round_robin", "round_robin"), Arm(f"{NAME} (hrrn, max_wait_s=120)", NAME),
                    Arm("hrrn, max_wait_s=240", NAME, (("max_wait_s", 240.0),)),
                    Arm("hrrn, max_wait_s=600", NAME, (("max_wait_s", 600.0),)),
                    Arm("hrrn, max_wait_s=inf", NAME, (("max_wait_s", 1e12),))]
                   + [Arm(f"kv_time, max_wait_s={w:g}", NAME, (("order", "kv_time"), ("max_wait_s", w)))
                      for w in (30, 60, 120, 240)]
                   + [Arm("kv_time, max_wait_s=inf (pure SJF)", NAME, (("order", "kv_time"), ("max_wait_s", 1e12)))],
                   few)]
    slack = [Table("KV gate slack, calibration, and late binding without reordering", Cell(),
                   [Arm("round_robin", "round_robin")]
                   + [Arm(f"kv_slack={s:g}", NAME, (("kv_slack", s),)) for s in (0.0, 0.3, 0.5, 1.0, 2.0)]
                   + [Arm("kv_slack=0, calibrate=False", NAME, (("kv_slack", 0.0), ("calibrate", False))),
                      Arm("calibrate=False", NAME, (("calibrate", False),)),
                      Arm("order=fcfs (late binding only)", NAME, (("order", "fcfs"),))], few)]
    scale = [Table("8 instances at 40 req/s", Cell(instances=8, rate=40.0, requests=4000),
                   [*_baselines(), lb], few)]
    a100 = [Table(f"4 x A100 at 80 req/s, chunked prefill {'on' if ch else 'off'}",
                  Cell(profile="llama3.1-8b-a100", rate=80.0, chunked=ch), [*_baselines(), lb], few)
            for ch in (False, True)]
    azure = [Table(f"Azure conversation trace, {'own rate' if r is None else f'{r:g} req/s'}",
                   Cell(profile="llama3.1-8b-a100", rate=r, trace=trace, requests=2000),
                   [*_baselines(False), lb, Arm("order=fcfs", NAME, (("order", "fcfs"),))],
                   1 if r is None else few,
                   note="A trace replays the same arrivals for every seed; at its own rate one seed is shown.")
             for r in (None, 30.0, 45.0)]
    sweep = [Table(f"rate {r:g}", Cell(rate=r), [Arm("round_robin", "round_robin"), lb,
                                                Arm(SWEEP_MEAN, NAME, (("max_wait_s", 600.0),))],
                   few) for r in (2.0, 5.0, 8.0, 11.0, 14.0, 17.0, 20.0)]
    breakdown = [Table("Paper setup, noisy:0.79", Cell(), [Arm("round_robin", "round_robin"), lb], few)]
    return {"paper": paper, "aging": aging, "slack": slack, "scale": scale, "a100": a100, "azure": azure,
            "sweep": sweep, "breakdown": breakdown}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--section", action="append", help="section(s) to run (default: all)")
    ap.add_argument("--seeds", type=int, default=10, help="paired seeds of the headline table (others: <= 3-5)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--trace", default=str(DEFAULT_TRACE), help="Azure conversation trace CSV")
    ap.add_argument("--list", action="store_true", help="list the sections and exit")
    args = ap.parse_args(argv)
    sections = build_sections(args.seeds, args.trace)
    if args.list:
        print("\n".join(sections))
        return 0
    chosen = args.section or list(sections)
    unknown = [s for s in chosen if s not in sections]
    if unknown:
        ap.error(f"unknown section(s) {unknown}; choose from {', '.join(sections)}")
    if "azure" in chosen and not Path(args.trace).is_file():
        print(f"note: no trace at {args.trace}; skipping the azure section (give --trace)", file=sys.stderr)
        chosen = [s for s in chosen if s != "azure"]
    t0 = time.perf_counter()
    for s in chosen:
        tables = sections[s]
        run_tables(tables, args.jobs)
        if s == "sweep":
            print_sweep(tables)
        elif s == "breakdown":
            for t in tables:
                print_table(t)
                print_breakdown(t)
        else:
            for t in tables:
                print_table(t)
        sys.stdout.flush()
    print(f"\n(ran in {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
