"""Where the learned router's gap is: signal (the predictor) or policy.

On the training's validation workloads (seeds just below the training seeds,
never evaluation seeds) of a setup, prints mean / p99 E2E and preemptions for:
round robin; the guidance heuristic (least mixing impact); the ``kv_gate``
teacher with true lengths (an oracle: what the network is taught); the same
gate on the predictor's lengths (what that policy is worth on the deployable
signal); and, with ``--checkpoint``, the network (gate off). Teacher vs gate on
predictions isolates the signal; network vs gate on predictions, the policy.

Usage: python bench/rl_gap.py [--checkpoint DIR] [--predictor noisy:0.79] [--seeds 2]
"""

from __future__ import annotations

import argparse
import sys

from _common import train_config, train_workload_args  # bench/_common.py, beside this script

from lbbench.profiles import load_profile
from lbbench.routers.mixing import MixingParams
from lbbench.routers.registry import get_router
from lbbench.training.curve import MixingHeuristic, evaluate, evaluate_network
from lbbench.training.episodes import episode_source
from lbbench.training.teachers import TeacherRouter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    train_workload_args(ap, requests=2000)
    ap.add_argument("--predictor", default="noisy:0.79")
    ap.add_argument("--seeds", type=int, default=2, help="validation workloads (seeds 999999, 999998, ...)")
    ap.add_argument("--max-defer-s", type=float, default=120.0)
    ap.add_argument("--checkpoint", default=None)
    args = ap.parse_args(argv)
    prof = load_profile(args.profile)
    cfg = train_config(args, predictor=args.predictor)
    src = episode_source(cfg, prof)
    seeds = [cfg.train_seed_base - 1 - k for k in range(args.seeds)]
    wls = [src(s) for s in seeds]
    m = args.instances
    rows = [("round_robin", lambda: get_router("round_robin", num_instances=m, profile=prof)),
            ("heuristic (least mixing)", lambda: MixingHeuristic(MixingParams.from_profile(prof))),
            ("kv_gate, true lengths (oracle teacher)", lambda: TeacherRouter(m, prof, args.max_defer_s)),
            (f"kv_gate, {args.predictor} lengths", lambda: TeacherRouter(m, prof, args.max_defer_s, oracle=False))]
    print(f"{args.profile} x{m}, {args.rate:g} req/s, {args.requests} requests, predictor {args.predictor}, "
          f"validation seeds {seeds}")
    rr = None
    results = [(name, evaluate(f, prof, cfg, wls, seeds)) for name, f in rows]
    if args.checkpoint:
        from lbbench.routers.rl.policy import load_policy
        results.append(("network (gate off)", evaluate_network(load_policy(args.checkpoint), prof, cfg, wls, seeds)))
    for name, res in results:
        rr = rr or res["mean_e2e_s"]
        print(f"  {name:<42} mean {res['mean_e2e_s']:7.2f} s ({100 * (rr - res['mean_e2e_s']) / rr:+6.1f} % vs RR)"
              f"  p99 {res['p99_e2e_s']:7.1f} s  preemptions {res['preemptions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
