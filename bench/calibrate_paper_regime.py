"""Calibrate the paper-regime profile's KV capacity to the paper's round-robin figure.

Sweeps ``kv.num_kv_blocks`` of a base profile (``max_model_len`` follows the KV
capacity, as vLLM requires) and prints round robin's mean E2E on the paper's
main setup (4 instances, paper-mix, 20 req/s, 2000 requests) over the
calibration seeds, which must not be the evaluation seeds (0-4). The paper
(Jain et al., arXiv 2408.13510) reports round robin at 168-173 s there; the
block count closest to 168 s is the one to write into ``llama2-7b-v100-paper``.

    python bench/calibrate_paper_regime.py --blocks 88,90,91,92,94 --seed 100
"""

from __future__ import annotations

import argparse
import statistics
import time

from lbbench.profiles import load_profile
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads import paper_mix

TARGET_S = 168.0


def round_robin_mean_e2e(profile, seeds, instances: int, requests: int, rate: float) -> dict:
    """Round robin on each seed: mean E2E over served requests, preemptions and rejections per seed."""
    means, preempt, rejected = [], [], []
    for s in seeds:
        recs = ClusterSim(profile, instances, paper_mix(requests, rate, s), seed=s).run(
            get_router("round_robin", num_instances=instances, seed=s, profile=profile))
        ok = [r for r in recs if r.error is None]
        means.append(statistics.fmean(r.finish_s - r.arrival_s for r in ok))
        preempt.append(sum(r.num_preemptions or 0 for r in ok))
        rejected.append(len(recs) - len(ok))
    return {"mean_e2e_s": statistics.fmean(means), "std_s": statistics.stdev(means) if len(means) > 1 else 0.0,
            "per_seed": means, "preemptions": statistics.fmean(preempt), "rejected": sum(rejected)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="llama2-7b-v100", help="base profile (step times kept)")
    ap.add_argument("--blocks", default="88,90,91,92,94", help="comma-separated num_kv_blocks to try")
    ap.add_argument("--seed", type=int, default=100, help="first calibration seed")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=20.0)
    args = ap.parse_args()
    base = load_profile(args.profile)
    seeds = range(args.seed, args.seed + args.seeds)
    print(f"round robin, {args.instances} x {args.profile}, paper-mix, {args.requests} requests at {args.rate} req/s, "
          f"seeds {seeds.start}-{seeds.stop - 1}; target {TARGET_S:.0f} s")
    best = None
    for blocks in (int(b) for b in args.blocks.split(",")):
        prof = base.with_overrides(num_kv_blocks=blocks,
                                   max_model_len=min(base.max_model_len, blocks * base.block_size))
        c0 = time.process_time()
        r = round_robin_mean_e2e(prof, seeds, args.instances, args.requests, args.rate)
        print(f"  {blocks:4d} blocks  mean E2E {r['mean_e2e_s']:6.1f} s (std {r['std_s']:.1f} over seeds)  "
              f"preemptions/seed {r['preemptions']:.0f}  rejected {r['rejected']}  "
              f"cpu {time.process_time() - c0:.1f} s")
        if best is None or abs(r["mean_e2e_s"] - TARGET_S) < abs(best[1] - TARGET_S):
            best = (blocks, r["mean_e2e_s"])
    if best is not None:
        print(f"closest to {TARGET_S:.0f} s: {best[0]} blocks ({best[1]:.1f} s)")


if __name__ == "__main__":
    main()
