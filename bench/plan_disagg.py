"""``lbbench plan --disagg``'s benchmark: does it pick disaggregation where the phases call for it, and how long
does it take?

1. ``workloads``: a P/D-favourable workload (prompts lognormal mean 3,000 cv 0.5, outputs mean 64, 32 req/s) and a
   P/D-unfavourable one (prompts 200, outputs 600, 80 req/s), each planned on A100 and H100 (the derived V1
   profiles of Llama-3.1-8B) at the example price file's placeholder prices (A100 $2, H100 $4 per GPU-hour), at
   two SLOs: a tight TBT (TTFT 1 s, TBT 25 ms) and a loose one (TTFT 2 s, TBT 100 ms), 90 % attainment. Target:
   disaggregation chosen for the first, aggregation for the second (or the numbers say why not).
2. ``speed``: ``plan --disagg`` on paper-mix at 100 req/s (2,000 requests, the plan default; and 6,000 on 3 seeds)
   must finish within 10 minutes; wall time and the host's load average are printed.

Every plan runs through the CLI (``python -m lbbench plan --disagg ... --format json``); numbers are simulated on
physics-derived profiles, not measured. Usage: ``python bench/plan_disagg.py [--seeds 3] [--requests 1000]
[--only workloads|speed]``; exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRICES = str(ROOT / "examples" / "prices.example.toml")
COMMON = ["--model", "llama-3.1-8b", "--gpu", "a100,h100", "--price-file", PRICES, "--format", "json"]
TARGET_WALL_S = 600.0


def plan(args: list[str]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "lbbench", "plan", "--disagg", *args, *COMMON], check=True,
                         capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout), time.perf_counter() - t0


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def rows(name: str, slo: str, doc: dict) -> list[str]:
    out = []
    for kind, lay in doc["layouts"].items():
        eq = lay["equal_cost_check"] or {}
        fewer = ", ".join(f"{k} {'-' if a is None else f'{100 * a:.0f} %'}"
                          for k, a in lay["attainment_with_one_fewer"].items())
        out.append(f"| {name} | {slo} | {kind}{' **(chosen)**' if kind == doc['chosen'] else ''} | {lay['fleet']} | "
                   f"${lay['cost']:.0f}/h | {_pct(lay['search_attainment'])} | {_pct(lay['check']['attainment'])} | "
                   f"{fewer} | {lay['goodput_per_gpu_hour']:,.0f} | {lay['goodput_per_usd']:,.0f} | "
                   f"{lay['equal_cost_fleet']} | {_pct(eq.get('attainment'))} |")
    return out


def exp_workloads(args) -> bool:
    shapes = {"favourable (3000 in / 64 out, 32 req/s)": (["--prompt-tokens", "3000:0.5", "--output-tokens", "64:0.5",
                                                        "--rate", "32"], "disaggregated"),
              "unfavourable (200 in / 600 out, 80 req/s)": (["--prompt-tokens", "200:0.5", "--output-tokens",
                                                             "600:0.5", "--rate", "80"], "aggregated")}
    slos = ("ttft=1,tbt=0.025", "ttft=2,tbt=0.1")
    print(f"\n## 1. Favourable and unfavourable workloads ({args.requests} requests, {args.seeds} seeds, "
          "90 % attainment, rdma-400g, pd_joint)\n")
    print("| workload | SLO | layout | cheapest fleet | cost | search | check (held-out) | one fewer of each | "
          "goodput/GPU-h | goodput/$ | at the cheaper cost | its check |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    verdicts = []
    for name, (shape, want) in shapes.items():
        for slo in slos:
            doc, wall = plan(["--workload", "poisson", *shape, "--requests", str(args.requests), "--seeds",
                              str(args.seeds), "--slo", slo, "--attainment", "0.9"])
            print("\n".join(rows(name.split(" (")[0], slo, doc)), flush=True)
            verdicts.append(f"{name}, {slo}: chose {doc['chosen']} (want {want}) in {wall:.0f} s")
            if slo == slos[0]:
                ok &= doc["chosen"] == want
    print()
    for v in verdicts:
        print("- " + v)
    return ok


def exp_speed(args) -> bool:
    print("\n## 2. Speed: plan --disagg on paper-mix at 100 req/s (A100, H100; 95 % attainment)\n")
    print("| SLO | requests x seeds | aggregated | disaggregated | chosen | fleets simulated | wall (s) | "
          "load average (1 min) before / after |")
    print("|---|---|---|---|---|---|---|---|")
    ok = True
    for slo, requests, seeds in (("ttft=2,tbt=0.1", 2000, 1), ("ttft=0.5,tbt=0.02", 2000, 1),
                                 ("ttft=0.5,tbt=0.02", 6000, 3)):
        before = os.getloadavg()[0]
        doc, wall = plan(["--workload", "paper-mix", "--rate", "100", "--slo", slo, "--attainment", "0.95",
                          "--requests", str(requests), "--seeds", str(seeds)])
        after = os.getloadavg()[0]
        lay = doc["layouts"]
        sims = sum(s["evaluations"] for k in doc["searches"] for s in doc["searches"][k])
        print(f"| {slo} | {requests} x {seeds} | {lay['aggregated']['fleet']} | {lay['disaggregated']['fleet']} | "
              f"{doc['chosen']} | {sims} | {wall:.1f} | {before:.1f} / {after:.1f} |", flush=True)
        ok &= wall <= TARGET_WALL_S
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--only", choices=("workloads", "speed"), default=None)
    args = ap.parse_args()
    ok = True
    for name, fn in (("workloads", exp_workloads), ("speed", exp_speed)):
        if args.only in (None, name):
            ok &= fn(args)
    print(f"\ntargets {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
