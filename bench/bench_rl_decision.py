"""Latency of one RL routing decision, featurization included (numpy only).

Builds a realistic cluster state — paper-mix at 20 req/s on ``--instances``
simulated instances of ``--profile``, routed round robin up to ``--at-s``
seconds of virtual time (hundreds of outstanding requests per instance) — then
times ``router.route(queue, view, now_s)`` for the ``wgrl`` router: features,
action mask, the out-of-distribution check, the network's forward pass and the
argmax; and the same call when the checkpoint's validation gate routes with the
guidance heuristic (the mixing penalty of the head on every instance). It also times the same call
plus building the ``ClusterView`` snapshot (what the dispatcher does before
every decision). Median and p99 over ``--repeats`` calls, in microseconds.

The network is the shipped checkpoint for the profile and instance count when
there is one, else random weights of the same shape (64 hidden units, 128 above
4 instances): the cost does not depend on the values. Target: <= 100 us.
Usage: python bench/bench_rl_decision.py [--instances 4] [--repeats 20000] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import numpy as np
from _common import build_state, snapshot_args, time_calls  # bench/_common.py, beside this script

from lbbench.profiles import load_profile
from lbbench.routers.rl.features import FeatureSpec
from lbbench.routers.rl.policy import CheckpointError, QPolicy, WorkloadGuidedRL


def make_router(profile, num_instances: int, tmp: str, checkpoint: str | None = None) -> tuple[WorkloadGuidedRL, str]:
    if checkpoint:
        return WorkloadGuidedRL(num_instances, checkpoint=checkpoint, gate=False), f"checkpoint {checkpoint}"
    try:  # the network path, even where the checkpoint's validation gate routes with the heuristic
        return WorkloadGuidedRL(num_instances, profile=profile, gate=False), "shipped checkpoint"
    except CheckpointError:
        spec = FeatureSpec.from_profile(profile, num_instances)
        hidden = 64 if num_instances <= 4 else 128
        rng = np.random.default_rng(0)
        dims = [spec.obs_dim, hidden, hidden, num_instances + 1]
        weights = [(rng.normal(0, 0.1, (a, b)).astype(np.float32), np.zeros(b, np.float32))
                   for a, b in zip(dims, dims[1:])]
        wide = [1e9] * spec.obs_dim  # a range every state is inside: the guard is checked, never taken
        QPolicy(weights, {"num_instances": num_instances, "feature_spec": spec.as_dict(),
                          "max_defer_s": 30.0, "obs_low": [-x for x in wide], "obs_high": wide}).save(tmp)
        return WorkloadGuidedRL(num_instances, checkpoint=tmp), "random weights"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    snapshot_args(ap, profile="llama2-7b-v100", at_s=60.0)
    ap.add_argument("--checkpoint", default=None, help="a trained checkpoint directory (default: the shipped one)")
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    sim = build_state(profile, args.instances, args.at_s, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        router, which = make_router(profile, args.instances, tmp, args.checkpoint)
        queue, view, now = sim.queue, sim.view(), sim.now_s
        outstanding = sum(iv.num_outstanding for iv in view.instances)
        route_us = time_calls(lambda: router.route(queue, view, now), args.repeats)
        with_view_us = time_calls(lambda: router.route(queue, sim.view(), now), args.repeats)
        router.heuristic_only = router.mixing is not None  # the validation gate's path
        heuristic_us = time_calls(lambda: router.route(queue, view, now), args.repeats)
    net = type(router.policy).__name__
    print(f"wgrl decision, {args.profile} x{args.instances} ({which}, {net}, obs {router.spec.obs_dim}, "
          f"{outstanding} outstanding requests, queue {len(queue)}), {args.repeats} calls:")
    for label, us in (("route (features, mask, OOD check, network)", route_us),
                      ("view snapshot + route", with_view_us),
                      ("route by the guidance heuristic (gate)", heuristic_us)):
        print(f"  {label:<40} median {np.median(us):7.1f} us   p99 {np.percentile(us, 99):7.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
