"""Precise against approximate prefix routing: ``precise_prefix`` (llm-d's precise prefix-cache scorer on the
instances' KV events, at event lags 0, 0.1 and 1 s; without and with llm-d's speculative indexing; with 10 % and
50 % of the events lost) beside the approximate routers that guess the caches from what they sent
(``prefix_load``, ``cache_aware``, ``token_affinity``, ``kv_overlap``).

Setup: 4 x ``bench/data/llama3.1-8b-a100-v1.toml`` (physics-derived; vLLM V1 scheduler, chunked prefill, a
2,048-token budget, 458k KV tokens per instance), prefix caching on, paired seeds 0-2, 1,000 requests:

- shared prefix (inference-perf's ``shared_prefix``): 128 groups x 8 users, 4,096-token system prompts (524k
  tokens of distinct prefixes: more than one instance holds), 256-token questions, 128-token answers, Poisson, at
  30 req/s;
- agentic (``agentic``'s defaults: tool loops with growing contexts, sub-agent forks, closed loop) at 40 calls/s.

Prints a markdown row per workload and router: mean TTFT (mean ± std over seeds), p99 TTFT, mean E2E (± std),
p99 E2E (p99s averaged over seeds), the prefix-cache hit rate, and for ``precise_prefix`` the KV events lost or
skipped. Usage: python bench/precise_prefix.py [--seeds 3] [--requests 1000]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import polars as pl

from lbbench.experiment import RunConfig
from lbbench.experiment.workload import build_requests
from lbbench.metrics.summary import per_seed
from lbbench.predict import annotate, load_predictor
from lbbench.profiles import load_profile
from lbbench.routers import get_router
from lbbench.rundir import records_frame
from lbbench.sim.cluster import ClusterSim

PROFILE = Path(__file__).resolve().parent / "data" / "llama3.1-8b-a100-v1.toml"
WORKLOADS = {
    "shared prefix, 30 req/s": ("inference-perf:groups=128,users=8,system=4096,question=256,output=128,"
                                "arrival=poisson", 30.0),
    "agentic, 40 calls/s": ("agentic", 40.0),
}
#: (label, router, options)
ROUTERS = [("prefix_load", "prefix_load", {}), ("cache_aware", "cache_aware", {}),
           ("token_affinity", "token_affinity", {}), ("kv_overlap", "kv_overlap", {})]
ROUTERS += [(f"precise_prefix, event lag {lag:g} s{', speculative' if spec else ''}", "precise_prefix",
             {"event_lag_s": lag, "speculative": spec}) for spec in (False, True) for lag in (0.0, 0.1, 1.0)]
ROUTERS += [(f"precise_prefix, event lag 0 s, {loss:.0%} of events lost", "precise_prefix", {"event_loss": loss})
            for loss in (0.1, 0.5)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1000)
    args = ap.parse_args()
    profile = load_profile(str(PROFILE))
    t0 = time.perf_counter()
    print(f"4 x llama3.1-8b-a100-v1 (V1, derived), prefix caching on, {args.requests} requests, "
          f"seeds 0-{args.seeds - 1}")
    print("| workload | router | mean TTFT (s) | p99 TTFT (s) | mean E2E (s) | p99 E2E (s) | hit rate | events lost / "
          "skipped |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for title, (workload, rate) in WORKLOADS.items():
        cfg = RunConfig(profile=str(PROFILE), instances=4, workload=workload, rate_per_s=rate,
                        requests=args.requests, prefix_caching=True)
        frames, notes = [], {}
        for seed in range(args.seeds):
            reqs = annotate(build_requests(cfg, profile, seed, None), load_predictor("oracle", profile=profile))
            for label, name, opts in ROUTERS:
                router = get_router(name, num_instances=4, seed=seed, profile=profile, **opts)
                sim = ClusterSim(profile, 4, reqs, prefix_caching=True, seed=seed)
                frames.append(records_frame(sim.run(router, label=label), {}))
                if name == "precise_prefix":
                    idx = router.index
                    lost, skipped = notes.get(label, (0, 0))
                    notes[label] = (lost + idx.num_lost, skipped + idx.num_skipped)
        per = per_seed(pl.concat(frames, how="diagonal_relaxed"), by=("router",)).collect()
        agg = per.group_by("router", maintain_order=True).agg(
            pl.col("mean_ttft_s").mean().alias("ttft"), pl.col("mean_ttft_s").std().alias("ttft_std"),
            pl.col("p99_ttft_s").mean().alias("p99_ttft"), pl.col("mean_e2e_s").mean().alias("e2e"),
            pl.col("mean_e2e_s").std().alias("e2e_std"), pl.col("p99_e2e_s").mean().alias("p99_e2e"),
            pl.col("prefix_cache_hit_rate").mean().alias("hit"))
        for r in agg.iter_rows(named=True):
            ev = notes.get(r["router"])
            print(f"| {title} | {r['router']} | {r['ttft']:.3f} ± {r['ttft_std']:.3f} | {r['p99_ttft']:.2f} | "
                  f"{r['e2e']:.2f} ± {r['e2e_std']:.2f} | {r['p99_e2e']:.2f} | {100 * r['hit']:.1f} % | "
                  f"{'-' if ev is None else f'{ev[0]} / {ev[1]}'} |")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
