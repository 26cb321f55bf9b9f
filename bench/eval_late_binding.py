"""Routers beyond the paper against the strongest baselines, across the load range (simulator).

Every table compares the late-binding router with the strongest *baseline combination*:
the best of the production routers (round_robin, jsq, least_requests, power_of_two) x the
instance-level schedulers (fcfs, least_work_left, vLLM's priority policy), chosen per rate
by mean E2E over the reported seeds (which favours the baseline). Reported per rate and
arm: mean E2E (± std over seeds), p99 E2E, goodput and SLO attainment, and the paired
gains against that reference (± std of the paired per-seed gain).

    python bench/eval_late_binding.py --section v100 --seeds 5 --jobs 2
    python bench/eval_late_binding.py --section azure --seeds 5 --jobs 2
    python bench/eval_late_binding.py --section breakdown --section aging --seeds 5
    python bench/eval_late_binding.py --list

Sections:

- ``v100``: 4 x llama2-7b-v100, paper-mix, ``noisy:0.79``, rates 2 (light) to 20 req/s;
- ``azure``: 4 x llama3.1-8b-a100-v0 on the Azure conversation trace, at its own rate and
  rescaled through saturation; seed k replays the trace's k-th window of ``--window-s``;
- ``breakdown``: where the gain comes from (instance-level ordering, release order,
  gating, placement), V100 at saturation and overload;
- ``aging``: the wait bound ``max_wait_s`` and the response-ratio aging rule, mean vs p99.

Parameters of the router were chosen on seeds 100-102, which no table reports (the
evaluation seeds start at ``--seed``, default 0). The figures depend on the profiles:
the script prints the git revision of ``profiles/`` it ran with.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from lbbench.distributed import get_executor
from lbbench.experiment import RunConfig, simulate
from lbbench.profiles import load_profile
from lbbench.metrics.reference import BASELINE_ROUTERS, with_reference
from lbbench.metrics.summary import Slo, per_seed, summarize

NAME = "late_binding_srpt"
SCHEDULERS = ("fcfs", "least_work_left", "priority")
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
KEYS = ["router", "instance_scheduler", "rate_per_s"]


@dataclass(frozen=True)
class Arm:
    """A router with options on one instance scheduler, under a label."""

    label: str
    router: str
    scheduler: str
    options: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Cell:
    """A workload on a cluster; ``rates`` are swept (None: a trace's own rate)."""

    title: str
    profile: str = "llama2-7b-v100"
    instances: int = 4
    rates: tuple[float | None, ...] = (20.0,)
    requests: int = 1000
    predictor: str = "noisy:0.79"
    trace: str | None = None
    window_s: float = 300.0
    max_prompt_tokens: int | None = None
    slo: Slo = field(default_factory=Slo)


def baseline_arms() -> list[Arm]:
    return [Arm(r, r, s) for r in BASELINE_ROUTERS for s in SCHEDULERS]


#: the router as shipped (its defaults) on each engine scheduler
def late_binding_arms() -> list[Arm]:
    return [Arm(f"{NAME}", NAME, s) for s in SCHEDULERS]


def _config(cell: Cell, arm: Arm, rate: float | None, seed: int) -> RunConfig:
    cfg = RunConfig(profile=cell.profile, instances=cell.instances, rate_per_s=rate, requests=cell.requests,
                    routers=[arm.router], router_options={arm.router: dict(arm.options)} if arm.options else {},
                    instance_schedulers=[arm.scheduler], seeds=1, seed=seed, predictor=cell.predictor,
                    timeline_interval_s=None)
    if cell.trace:
        opts: dict[str, Any] = {"window": (seed * cell.window_s, (seed + 1) * cell.window_s)}
        if cell.max_prompt_tokens:
            opts.update(max_prompt_tokens=cell.max_prompt_tokens, prompt_overflow="filter")
        cfg = replace(cfg, trace=cell.trace, trace_options=opts, requests=None)
    return cfg


def _job(args: tuple[Cell, Arm, float | None, int]) -> pl.DataFrame:
    cell, arm, rate, seed = args
    cfg = _config(cell, arm, rate, seed)
    frames = [out.records for out in simulate(cfg, load_profile(cfg.profile), "eval")]
    df = pl.concat(frames, how="diagonal_relaxed")
    rate_col = pl.lit(-1.0 if rate is None else rate, pl.Float64)  # -1: the trace's own rate
    return df.with_columns(pl.lit(arm.label).alias("router"), rate_col.alias("rate_per_s"))


def run_cell(cell: Cell, arms: list[Arm], seeds: list[int], jobs: int) -> pl.DataFrame:
    work = [(cell, a, r, s) for r in cell.rates for a in arms for s in seeds]
    frames: list[pl.DataFrame] = [pl.DataFrame()] * len(work)
    with get_executor(jobs, batch_size=1) as ex:  # spawn processes for jobs > 1, else here
        for i, df in ex.submit(work, _job):
            frames[i] = df
    return pl.concat(frames, how="diagonal_relaxed")


# ---------------------------------------------------------------------------- tables


def _f(x: float | None, nd: int = 1) -> str:
    return "-" if x is None or x != x else f"{x:.{nd}f}"


def paired_std(df: pl.DataFrame, slo: Slo, ref: dict[float, tuple[str, str]]) -> dict[tuple, float]:
    """Std over seeds of each group's paired mean-E2E gain (%) against the reference."""
    seeds = per_seed(df, KEYS, slo).collect()
    out = {}
    for rate, (router, sched) in ref.items():
        part = seeds.filter(pl.col("rate_per_s") == rate)
        base = part.filter((pl.col("router") == router) & (pl.col("instance_scheduler") == sched))
        base_m = dict(zip(base["seed"].to_list(), base["mean_e2e_s"].to_list()))
        for (r, s), g in part.group_by(["router", "instance_scheduler"]):
            gains = [100 * (base_m[sd] - m) / base_m[sd] for sd, m in zip(g["seed"], g["mean_e2e_s"])]
            out[(r, s, rate)] = float(np.std(gains, ddof=1)) if len(gains) > 1 else 0.0
    return out


def print_cell(cell: Cell, df: pl.DataFrame, arms: list[Arm], seeds: list[int]) -> pl.DataFrame:
    s = with_reference(summarize(df, by=KEYS, slo=cell.slo), df, KEYS, cell.slo)
    ref = {}
    for row in s.iter_rows(named=True):
        if row["vs_best_baseline_pct"] == 0 and row["router"] in BASELINE_ROUTERS:
            ref.setdefault(row["rate_per_s"], (row["router"], row["instance_scheduler"]))
    sd = paired_std(df, cell.slo, ref)
    new = [a.label for a in arms if a.router not in BASELINE_ROUTERS]
    where = f"trace {Path(cell.trace).name}" if cell.trace else "paper-mix"
    print(f"\n### {cell.title}\n")
    print(f"{cell.instances} x {cell.profile}, {where}, predictor {cell.predictor}, "
          f"{'windows of ' + format(cell.window_s, 'g') + ' s' if cell.trace else str(cell.requests) + ' requests'}, "
          f"seeds {seeds[0]}..{seeds[-1]} (paired); SLO {cell.slo.describe()}\n")
    print("| rate (req/s) | router / instance scheduler | mean E2E (s) | vs best (%) | p99 E2E (s) | p99 vs best (%) "
          "| goodput (req/s) | met SLO | preemptions | router wait max (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rate in cell.rates:
        key = -1.0 if rate is None else rate
        part = s.filter(pl.col("rate_per_s") == key)
        best = ref.get(key)
        rows = [r for r in part.iter_rows(named=True)
                if (r["router"], r["instance_scheduler"]) == best or r["router"] in new]
        # the best baseline by p99 too, when it is another combination
        base_rows = [r for r in part.iter_rows(named=True) if r["router"] in BASELINE_ROUTERS]
        p99_best = min(base_rows, key=lambda r: r["p99_e2e_s"])
        if (p99_best["router"], p99_best["instance_scheduler"]) != best:
            rows.insert(1, p99_best)
        for r in rows:
            combo = f"{r['router']} / {r['instance_scheduler']}"
            tag = " **(strongest baseline)**" if (r["router"], r["instance_scheduler"]) == best else (
                " (best baseline p99)" if r is p99_best else "")
            gain_sd = sd.get((r["router"], r["instance_scheduler"], key), 0.0)
            print(f"| {'own' if rate is None else format(rate, 'g')} | {combo}{tag} | "
                  f"{_f(r['mean_e2e_s'], 2)} ± {_f(r['mean_e2e_std_s'], 2)} | "
                  f"{r['vs_best_baseline_pct']:+.1f} ± {gain_sd:.1f} | {_f(r['p99_e2e_s'])} | "
                  f"{r['p99_vs_best_baseline_pct']:+.1f} | {_f(r['goodput_per_s'], 2)} | "
                  f"{100 * r['slo_attainment']:.1f} % | {_f(r['preemptions'], 0)} | {_f(r['router_wait_max_s'])} |")
    return s


# ---------------------------------------------------------------------------- sections


V100_SLO = Slo(ttft_s=2.0, tbt_s=0.1)
A100_SLO = Slo(ttft_s=1.0, tbt_s=0.05)


def sections(trace: str) -> dict[str, tuple[list[Cell], list[Arm]]]:
    v100 = Cell("4 x V100, paper-mix, load sweep", rates=(2.0, 5.0, 8.0, 10.0, 12.0, 15.0, 20.0), slo=V100_SLO)
    azure = Cell("4 x A100, Azure conversation trace", profile="llama3.1-8b-a100-v0", rates=(None, 20.0, 30.0, 40.0),
                 trace=trace, window_s=300.0, slo=A100_SLO)
    lb = NAME
    breakdown_arms = [
        Arm("round_robin", "round_robin", "fcfs"),
        Arm("+ instance ordering (priority)", "round_robin", "priority"),
        Arm("late binding, FCFS release, no gate", lb, "fcfs", (("order", "fcfs"), ("kv_slack", 1e6))),
        Arm("+ KV gate", lb, "fcfs", (("order", "fcfs"),)),
        Arm("+ SJF release order", lb, "fcfs", ()),
        Arm("+ SJF release, random placement", lb, "fcfs", (("prefill_weight", 0.0), ("decode_weight", 0.0),
                                                            ("tie_s", 1e9))),
        Arm("SJF release, no gate", lb, "fcfs", (("kv_slack", 1e6),)),
        Arm("late binding on priority engine", lb, "priority", ()),
        Arm("jsq", "jsq", "priority"),
    ]
    aging_arms = ([Arm("jsq / priority", "jsq", "priority"), Arm("jsq / fcfs", "jsq", "fcfs")]
                  + [Arm(f"SJF, max_wait_s={w:g}", lb, "fcfs", (("max_wait_s", w),)) for w in (1e9, 120.0, 60.0, 30.0)]
                  + [Arm(f"hrrn aging, max_wait_s={w:g}", lb, "fcfs", (("order", "hrrn"), ("max_wait_s", w)))
                     for w in (1e9, 60.0)])
    return {
        "v100": ([v100], baseline_arms() + late_binding_arms()),
        "azure": ([azure], baseline_arms() + late_binding_arms()),
        "breakdown": ([Cell("Where the gain comes from (V100, paper-mix)", rates=(10.0, 20.0), slo=V100_SLO)],
                      breakdown_arms),
        "aging": ([Cell("Wait bound and aging: mean against tail (V100, paper-mix)", rates=(10.0, 20.0),
                        slo=V100_SLO)], aging_arms),
    }


def print_plain(cell: Cell, df: pl.DataFrame, arms: list[Arm]) -> None:
    """Every arm, no reference selection: the breakdown and aging tables."""
    labels = [a.label for a in arms]
    if len(set(labels)) != len(labels):
        raise ValueError(f"arm labels must be unique: {labels}")
    s = summarize(df, by=["router", "rate_per_s"], slo=cell.slo)
    print(f"\n### {cell.title}\n")
    print("| rate (req/s) | arm (instance scheduler) | mean E2E (s) | p99 E2E (s) | goodput (req/s) | preemptions "
          "| mean router wait (s) | max router wait (s) |")
    print("|---|---|---|---|---|---|---|---|")
    sched = {a.label: a.scheduler for a in arms}
    for r in s.sort("rate_per_s", maintain_order=True).iter_rows(named=True):
        print(f"| {r['rate_per_s']:g} | {r['router']} ({sched[r['router']]}) | {_f(r['mean_e2e_s'], 2)} ± "
              f"{_f(r['mean_e2e_std_s'], 2)} | {_f(r['p99_e2e_s'])} | {_f(r['goodput_per_s'], 2)} | "
              f"{_f(r['preemptions'], 0)} | {_f(r['mean_router_wait_s'], 2)} | {_f(r['router_wait_max_s'])} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--section", action="append", help="section(s) to run (default: all)")
    ap.add_argument("--seeds", type=int, default=5, help="paired evaluation seeds")
    ap.add_argument("--seed", type=int, default=0, help="first evaluation seed (tuning used 100-102)")
    ap.add_argument("--requests", type=int, default=None, help="requests per run (paper-mix cells)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--trace", default=str(DEFAULT_TRACE), help="Azure conversation trace CSV")
    ap.add_argument("--out", default=None, help="directory for the raw request rows (one parquet per section)")
    ap.add_argument("--list", action="store_true", help="list the sections and exit")
    args = ap.parse_args(argv)
    secs = sections(args.trace)
    if args.list:
        print("\n".join(secs))
        return 0
    chosen = args.section or list(secs)
    unknown = [s for s in chosen if s not in secs]
    if unknown:
        ap.error(f"unknown section(s) {unknown}; choose from {', '.join(secs)}")
    if "azure" in chosen and not Path(args.trace).is_file():
        ap.error(f"--trace {args.trace}: no such file (the azure section needs the Azure conversation trace)")
    rev = subprocess.run(["git", "log", "-1", "--format=%h", "--", "profiles/"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    print(f"profiles at git revision {rev or 'unknown'}")
    seeds = list(range(args.seed, args.seed + args.seeds))
    t0 = time.perf_counter()
    for name in chosen:
        cells, arms = secs[name]
        for cell in cells:
            if args.requests and not cell.trace:
                cell = replace(cell, requests=args.requests)
            df = run_cell(cell, arms, seeds, args.jobs)
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                df.write_parquet(Path(args.out) / f"{name}.parquet")
            if name in ("breakdown", "aging"):
                print_plain(cell, df, arms)
            else:
                print_cell(cell, df, arms, seeds)
            sys.stdout.flush()
    print(f"\n(ran in {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
