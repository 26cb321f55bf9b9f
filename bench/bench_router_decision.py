"""Decision cost of the routers platform teams deploy: ``kv_overlap``, ``token_affinity``, ``predicted_latency``.

Builds a cluster state on ``--instances`` simulated instances of ``--profile`` (paper-mix at 20 req/s per 4
instances, routed round robin up to ``--at-s`` seconds of virtual time), then times
``router.route(queue, view, now_s)`` for each router, and the same call with the ``ClusterView`` snapshot
built first (what the dispatcher does before every decision). ``predicted_latency`` is timed fitted (its
models refit on ``--samples`` synthetic completions first), so each call predicts TTFT and TPOT for every
instance; ``least_requests`` is the floor. Median and p99 over ``--repeats`` calls, in microseconds.
Target: predicted_latency's median <= 200 us for 4 instances.
Usage: python bench/bench_router_decision.py [--instances 4] [--repeats 20000]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from _common import build_state, snapshot_args, time_calls  # bench/_common.py, beside this script

from lbbench.profiles import load_profile
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim

ROUTERS = ("least_requests", "kv_overlap", "token_affinity", "predicted_latency")


def warm(router, sim: ClusterSim, samples: int, seed: int) -> None:
    """Fit predicted_latency on synthetic samples shaped like the snapshot's features (both queue regimes, so
    that it predicts with its queued / unqueued sub-models)."""
    from lbbench.routers.latency_model import bucket_key
    rng = np.random.default_rng(seed)
    head, view = sim.queue[0], sim.view()
    base = np.array([router.features(head, iv)[0] for iv in view.instances], dtype=float)
    for k in range(samples):
        x = base[rng.integers(len(base))] * rng.uniform(0.5, 1.5, base.shape[1])
        x[0], x[3] = (1.0, max(1.0, x[3])) if k % 2 else (0.0, 0.0)
        key = bucket_key(x[3], x[1], x[6])
        router.model.add("ttft", x, key, 0.05 + 1e-4 * x[2] + rng.exponential(0.02))
        router.model.add("tpot", x, key, 0.01 + 1e-4 * x[4] + rng.exponential(0.002))
    router.refit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    snapshot_args(ap, profile="llama3.1-8b-a100-v0", at_s=30.0)
    ap.add_argument("--samples", type=int, default=2000, help="predicted_latency's training window")
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    sim = build_state(profile, args.instances, args.at_s, args.seed)
    queue, now = sim.queue, sim.now_s
    view = sim.view()
    outstanding = sum(iv.num_outstanding for iv in view.instances)
    print(f"decision cost, {args.profile} x{args.instances} ({outstanding} outstanding requests), "
          f"{args.repeats} calls each:")
    for name in ROUTERS:
        router = get_router(name, num_instances=args.instances, seed=args.seed, profile=profile)
        if name == "predicted_latency":
            warm(router, sim, args.samples, args.seed)
        route_us = time_calls(lambda: router.route(queue, view, now), args.repeats)
        with_view_us = time_calls(lambda: router.route(queue, sim.view(), now), args.repeats)
        for label, us in (("route", route_us), ("view + route", with_view_us)):
            print(f"  {name:<18} {label:<13} median {np.median(us):7.1f} us   p99 {np.percentile(us, 99):7.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
