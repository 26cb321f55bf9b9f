"""Cache-aware routers on prefix-sharing traffic, with prefix caching on in the simulator.

Two workloads on 4 x llama3.1-8b-a100-v0 (vLLM V0 semantics, as the profile says):

- the Mooncake FAST'25 trace (``synthetic_trace.jsonl``: 512-token ``hash_ids``), prompts truncated to
  7,000 tokens (hashes cut with them) so they fit the 8k context. Paired samples are consecutive
  windows of the trace, each rescaled to the rate: the first quarter of the trace is for tuning, the
  other three quarters are the evaluation windows;
- synthetic multi-turn sessions (``sessions`` workload: 8 shared 1,024-token system prompts for 80 %
  of sessions, 4 turns on average, 2 s mean think time, closed loop). Tuning seeds 100-101,
  evaluation seeds 0-2.

For every rate it prints, per router, the means over the paired samples of the prefix-cache hit
rate, mean/p99 TTFT, mean/p99 E2E, goodput at the SLO (TTFT <= 2 s and mean TBT <= 0.1 s per
request) and preemptions, and how many samples each router's mean TTFT and goodput were the best.

Usage: python bench/eval_prefix_routers.py [--workload mooncake|sessions|both] [--split eval|tune]
       [--rates 4,8,12] [--session-rates 60,120,240] [--router-opt ROUTER.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import polars as pl

from lbbench.rundir import records_frame
from lbbench.profiles import load_profile
from lbbench.metrics.summary import Slo, per_seed
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads.sessions import parse_session_spec, sessions
from lbbench.workloads.traces import load_trace_requests

ROUTERS = ("round_robin", "cache_aware", "prefix_load", "session_affinity", "cache_length_aware")
SLO = Slo(ttft_s=2.0, tbt_s=0.1)
TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "synthetic_trace.jsonl"
TRACE_SPAN_S = 1022.0
SESSION_SPEC = "sessions:system=1024,prompts=8,share=0.8,turns=4,think=2"


def mooncake_samples(split: str, rate: float) -> list[list]:
    quarter = TRACE_SPAN_S / 4
    windows = [(0.0, quarter)] if split == "tune" else [(k * quarter, (k + 1) * quarter) for k in (1, 2, 3)]
    return [load_trace_requests(TRACE, window=w, rate=rate, max_prompt_tokens=7000, prompt_overflow="truncate")
            for w in windows]


def session_samples(split: str, rate: float, profile, requests: int) -> list[list]:
    seeds = (100, 101) if split == "tune" else (0, 1, 2)
    spec = parse_session_spec(SESSION_SPEC)
    return [sessions(requests, rate, s, spec, max_model_len=profile.max_model_len) for s in seeds]


def run_rate(samples: list[list], profile, routers, opts, instances: int) -> pl.DataFrame:
    frames = []
    for k, reqs in enumerate(samples):
        for name in routers:
            router = get_router(name, num_instances=instances, seed=k, profile=profile, **opts.get(name, {}))
            sim = ClusterSim(profile, instances, reqs, seed=k, prefix_caching=True)
            frames.append(records_frame(sim.run(router), {}))
    df = pl.concat(frames, how="diagonal_relaxed")
    return per_seed(df, by=("router",), slo=SLO).collect()


def report(title: str, per: pl.DataFrame) -> None:
    best_ttft = per.group_by("seed").agg(pl.col("router").sort_by("mean_ttft_s").first().alias("r"))
    best_good = per.group_by("seed").agg(pl.col("router").sort_by("goodput_per_s", descending=True)
                                         .first().alias("r"))
    print(f"\n{title}")
    print("| router | hit rate | mean TTFT (s) | p99 TTFT (s) | mean E2E (s) | p99 E2E (s) | goodput (req/s) "
          "| preemptions | best TTFT / best goodput (samples) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    agg = per.group_by("router", maintain_order=True).agg(
        pl.col("prefix_cache_hit_rate", "mean_ttft_s", "p99_ttft_s", "mean_e2e_s", "p99_e2e_s", "goodput_per_s",
               "preemptions").mean(), pl.len().alias("n"))
    for row in agg.iter_rows(named=True):
        r = row["router"]
        wins = (best_ttft.filter(pl.col("r") == r).height, best_good.filter(pl.col("r") == r).height)
        print(f"| {r} | {row['prefix_cache_hit_rate']:.3f} | {row['mean_ttft_s']:.3f} | {row['p99_ttft_s']:.2f} "
              f"| {row['mean_e2e_s']:.2f} | {row['p99_e2e_s']:.1f} | {row['goodput_per_s']:.3f} "
              f"| {row['preemptions']:.0f} | {wins[0]} / {wins[1]} of {row['n']} |")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("mooncake", "sessions", "both"), default="both")
    ap.add_argument("--split", choices=("eval", "tune"), default="eval")
    ap.add_argument("--rates", default="4,8,12", help="Mooncake request rates (req/s)")
    ap.add_argument("--session-rates", default="60,120,240", help="sessions: offered request rates (req/s)")
    ap.add_argument("--session-requests", type=int, default=3000)
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--profile", default="llama3.1-8b-a100-v0")
    ap.add_argument("--router-opt", action="append", default=[], metavar="ROUTER.KEY=VALUE")
    args = ap.parse_args()
    profile = load_profile(args.profile)
    routers = args.routers.split(",")
    opts: dict[str, dict] = {}
    for o in args.router_opt:
        name, _, kv = o.partition(".")
        key, _, value = kv.partition("=")
        try:
            opts.setdefault(name, {})[key] = float(value)
        except ValueError:
            opts.setdefault(name, {})[key] = value
    print(f"{args.instances} x {args.profile}, prefix caching on, split {args.split}, SLO {SLO.describe()}, "
          f"router options {opts or 'defaults'}")
    if args.workload in ("mooncake", "both"):
        if not TRACE.is_file():
            raise SystemExit(f"missing trace {TRACE}")
        for rate in (float(x) for x in args.rates.split(",")):
            t0 = time.perf_counter()
            per = run_rate(mooncake_samples(args.split, rate), profile, routers, opts, args.instances)
            report(f"Mooncake trace at {rate:g} req/s ({time.perf_counter() - t0:.0f} s)", per)
    if args.workload in ("sessions", "both"):
        for rate in (float(x) for x in args.session_rates.split(",")):
            t0 = time.perf_counter()
            samples = session_samples(args.split, rate, profile, args.session_requests)
            per = run_rate(samples, profile, routers, opts, args.instances)
            report(f"sessions ({SESSION_SPEC}) offered {rate:g} req/s ({time.perf_counter() - t0:.0f} s)", per)


if __name__ == "__main__":
    main()
