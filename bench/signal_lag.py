"""How each router degrades when its signals are stale: the router sees what the instances report (first tokens,
finishes, preemptions) ``--signal-lag-s`` late, its own dispatches at once (``lbbench.dispatch.Dispatcher``).

Setup: 4 x ``bench/data/llama3.1-8b-a100-v1.toml`` (physics-derived by ``lbbench profile derive --model
llama-3.1-8b --gpu a100-80gb --max-num-seqs 128 --max-num-batched-tokens 2048``: vLLM V1 scheduler, chunked
prefill, a 2,048-token budget), prefix caching on, inference-perf's shared-prefix traffic (16 groups x 8 users,
2,048-token system prompts, 256-token questions and answers, Poisson arrivals) at 40 req/s, 1,000 requests, paired
seeds 0-2. Lags 0, 0.1, 0.5 and 2 s (BLIS models 2 s of cache-signal staleness). Prints one markdown row per
router and lag: mean TTFT (mean ± std over seeds), p99 TTFT, mean E2E (± std), p99 E2E (p99s averaged over seeds),
the change of mean TTFT against the same router at lag 0, and the hit rate.

Usage: python bench/signal_lag.py [--lags 0,0.1,0.5,2] [--rate 40] [--requests 1000] [--seeds 3] [--routers A,B]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import polars as pl

from lbbench.experiment import RunConfig, run_experiment
from lbbench.metrics.summary import per_seed
from lbbench.rundir import read_requests

PROFILE = Path(__file__).resolve().parent / "data" / "llama3.1-8b-a100-v1.toml"
WORKLOAD = "inference-perf:groups=16,users=8,system=2048,question=256,output=256,arrival=poisson"
ROUTERS = ("round_robin", "least_requests", "jsq", "prefix_load", "cache_aware", "token_affinity", "kv_overlap",
           "predicted_latency")


def run_lag(lag_s: float, args: argparse.Namespace, out: Path) -> pl.DataFrame:
    cfg = RunConfig(profile=str(PROFILE), instances=4, workload=WORKLOAD, prefix_caching=True,
                    rate_per_s=args.rate, requests=args.requests, routers=list(args.routers), seeds=args.seeds,
                    seed=0, timeline_interval_s=None, signal_lag_s=lag_s)
    run_experiment(cfg, out / f"lag-{lag_s:g}")
    df = read_requests(out / f"lag-{lag_s:g}")
    return per_seed(df, by=("router",)).collect().with_columns(pl.lit(lag_s).alias("lag_s"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lags", default="0,0.1,0.5,2")
    ap.add_argument("--rate", type=float, default=40.0)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--routers", default=",".join(ROUTERS))
    args = ap.parse_args()
    args.routers = args.routers.split(",")
    lags = [float(x) for x in args.lags.split(",")]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        per = pl.concat([run_lag(lag, args, Path(tmp)) for lag in lags], how="diagonal_relaxed")
    agg = per.group_by("router", "lag_s", maintain_order=True).agg(
        pl.col("mean_ttft_s").mean().alias("ttft"), pl.col("mean_ttft_s").std().alias("ttft_std"),
        pl.col("p99_ttft_s").mean().alias("p99_ttft"), pl.col("mean_e2e_s").mean().alias("e2e"),
        pl.col("mean_e2e_s").std().alias("e2e_std"), pl.col("p99_e2e_s").mean().alias("p99_e2e"),
        pl.col("prefix_cache_hit_rate").mean().alias("hit"))
    base = agg.filter(pl.col("lag_s") == lags[0]).select("router", pl.col("ttft").alias("ttft0"))
    agg = agg.join(base, on="router", how="left", maintain_order="left")
    print(f"4 x llama3.1-8b-a100-v1 (V1, derived), {WORKLOAD}, prefix caching on, {args.rate:g} req/s, "
          f"{args.requests} requests, seeds 0-{args.seeds - 1}")
    print("| router | lag (s) | mean TTFT (s) | p99 TTFT (s) | mean E2E (s) | p99 E2E (s) | TTFT vs lag 0 | hit rate |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in agg.sort("router", "lag_s", maintain_order=True).iter_rows(named=True):
        change = 100 * (r["ttft"] - r["ttft0"]) / r["ttft0"]
        print(f"| {r['router']} | {r['lag_s']:g} | {r['ttft']:.3f} ± {r['ttft_std']:.3f} | {r['p99_ttft']:.2f} | "
              f"{r['e2e']:.2f} ± {r['e2e_std']:.2f} | {r['p99_e2e']:.2f} | {change:+.1f} % | {100 * r['hit']:.1f} % |")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
