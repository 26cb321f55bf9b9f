"""``lbbench plan``'s benchmark: paper-mix at 20 req/s, Llama-3.1-8B, TTFT <= 2 s and TBT <= 0.1 s for 95 % of
requests, on a100-80gb, h100 and l4 (the derived profiles; simulated, not measured on GPUs).

Prints the planned counts, each row's attainment at n and n - 1, and the wall-clock time, and checks the targets:
the plan finishes within 5 minutes; at every row n meets the target and n - 1 does not; H100 needs no more
instances than A100, and A100 no more than L4. Exit code 1 when a check fails. Usage:
python bench/bench_plan.py [--rate R] [--seeds K] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from lbbench.experiment import RunConfig
from lbbench.planning import PlanConfig, plan_capacity
from lbbench.metrics.summary import Slo

TARGET_WALL_S = 300.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    target = 0.95
    cfg = PlanConfig(run=RunConfig(workload="paper-mix", rate_per_s=args.rate, routers=["jsq"], seeds=args.seeds),
                     model="llama-3.1-8b", gpus=["a100-80gb", "h100", "l4"], slo=Slo(ttft_s=2.0, tbt_s=0.1),
                     attainment=target, jobs=args.jobs)
    t0 = time.perf_counter()
    plan = plan_capacity(cfg)
    wall_s = time.perf_counter() - t0
    counts = {r["gpu"]: r["instances"] for r in plan.rows}
    checks = {
        f"finishes within {TARGET_WALL_S:.0f} s": wall_s <= TARGET_WALL_S,
        "n meets the target and n - 1 does not, at every row": all(
            r["attainment"] >= target > r["attainment_at_fewer"] for r in plan.rows),
        "h100 <= a100-80gb <= l4": counts.get("h100", 0) <= counts.get("a100-80gb", -1) <= counts.get("l4", -1),
    }
    print(json.dumps({"wall_s": round(wall_s, 1), "instances": counts,
                      "attainment": {r["gpu"]: round(r["attainment"], 4) for r in plan.rows},
                      "attainment_at_fewer": {r["gpu"]: round(r["attainment_at_fewer"], 4) for r in plan.rows},
                      "checks": checks}, indent=2))
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
