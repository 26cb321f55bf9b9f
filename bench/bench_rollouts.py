"""Rollout throughput for RL training: transitions per second against the worker count.

Collects the same ``--episodes`` ε-greedy episodes (``--requests`` requests of
paper-mix at ``--rate`` req/s on ``--instances`` simulated instances of
``--profile``, a random shared network with the KV features, ε = 0.1) with
1 worker (in process) and with process pools of 2 and 4 workers
(``lbbench.distributed``'s actor pools; ``--ray``: Ray actors instead, on the
cluster ``lbbench.distributed.ray_cluster.connect`` finds), and prints transitions per second of wall time, the pool's start-up
excluded (it is paid once per training run). Every worker count returns the
same transitions (checked).

Usage: python bench/bench_rollouts.py [--workers 1,2,4] [--episodes 8] [--requests 1000] [--ray]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from _common import train_config, train_workload_args  # bench/_common.py, beside this script

from lbbench.profiles import load_profile
from lbbench.training.config import TrainConfig
from lbbench.training.rollouts import EpisodeTask, make_collector


def random_policy(cfg: TrainConfig, profile):
    import torch
    from lbbench.routers.rl.features import FeatureSpec
    from lbbench.training.trainer import checkpoint_meta, export_policy, make_network
    torch.manual_seed(0)
    spec = FeatureSpec.from_profile(profile, cfg.instances, kv_features=cfg.kv_features)
    return export_policy(make_network(cfg, spec), checkpoint_meta(cfg, profile, spec))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    train_workload_args(ap, requests=1000)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--ray", nargs="?", const="auto", default=None, help="Ray actors (auto or ADDRESS)")
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    cfg = train_config(args, predictor="noisy:0.79", network="shared", kv_features=True, max_defer_s=30.0)
    policy = random_policy(cfg, profile)
    tasks = [EpisodeTask(k, 2_000_000 + k, epsilon=0.1) for k in range(args.episodes)]
    reference = None
    print(f"rollouts: {args.episodes} episodes of {args.requests} requests, {args.profile} x{args.instances}, "
          f"{args.rate:g} req/s, {'Ray actors' if args.ray else 'process pool'}")
    for n in (int(x) for x in args.workers.split(",")):
        coll = make_collector(cfg, profile, n, args.ray)
        try:
            if n > 1:  # start every worker (spawn, imports) before timing
                coll.collect(policy, [EpisodeTask(10**6 + k, 3_000_000 + k, epsilon=0.1) for k in range(n)])
            t0, c0 = time.perf_counter(), time.process_time()
            out = coll.collect(policy, tasks)
            wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        finally:
            coll.close()
        num = sum(len(t) for t in out)
        actions = np.concatenate([t.action for t in out])
        same = "reference" if reference is None else ("same" if np.array_equal(reference, actions) else "DIFFERENT")
        reference = actions if reference is None else reference
        print(f"  workers {n}: {num} transitions in {wall_s:6.1f} s wall -> {num / wall_s:7.0f} transitions/s "
              f"(driver CPU {cpu_s:.1f} s; transitions {same})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
