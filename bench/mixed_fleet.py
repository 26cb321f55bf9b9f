"""Mixed fleets in the simulator: every router, blind and capacity-aware, with vLLM's fcfs and priority engines.

    python bench/mixed_fleet.py untuned --trace AzureLLMInferenceTrace_conv.csv     # H100 + 2 A100 + L4, Azure conv
                                                                                    # (5 windows of the trace)
    python bench/mixed_fleet.py f1                                                  # 2 A100 + 2 L4, paper-mix, R and 1.3 R
    python bench/mixed_fleet.py f1 --find-rate                                      # pick R again (seeds 1000-1001)

Each F1 table is one `lbbench run` (printed before it runs), the untuned one five (one per trace window): paired seeds 0-4, --predictor noisy:0.79. Rows: mean ± std
of the per-seed mean E2E, p50 and p99 E2E, mean TTFT and preemptions per run as `lbbench run` reports them over the
seeds; the best router x scheduler is marked; then the capacity-aware forms' gain over their blind forms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

LBBENCH = [sys.executable, "-m", "lbbench"] if not os.environ.get("LBBENCH") else os.environ["LBBENCH"].split()

ROUTERS = ("round_robin,random,weighted_round_robin,jsq,least_requests,jsq_speed,least_work_speed,"
           "min_min,min_min_speed,mcu,late_binding_srpt")
PAIRS = (("weighted_round_robin", "round_robin"), ("jsq_speed", "least_requests"),
         ("least_work_speed", "jsq"), ("min_min_speed", "min_min"))
UNTUNED = "llama3.1-8b-h100-v0:1,llama3.1-8b-a100-v0:2,llama3.1-8b-l4-v0:1"
F1 = "llama3.1-8b-a100-v0:2,llama3.1-8b-l4-v0:2"
WINDOW_S = 600  # untuned: window k of the trace is [600 k, 600 (k + 1)) s


def lbbench_json(args: list[str]) -> list[dict] | dict:
    print("$ lbbench run " + " ".join(args), flush=True)
    out = subprocess.run(LBBENCH + ["run", *args, "--format", "json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def table(rows: list[dict], title: str) -> str:
    best = min(rows, key=lambda r: r["mean_e2e_s"])
    lines = [f"**{title}**", "",
             "| router | engine | mean E2E (s) | p50 (s) | p99 (s) | mean TTFT (s) | preemptions / run |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        mark = " **(best)**" if r is best else ""
        lines.append(f"| {r['router']}{mark} | {r.get('instance_scheduler', 'fcfs')} | {r['mean_e2e_s']:.2f} ± "
                     f"{r['mean_e2e_std_s']:.2f} | {r['p50_e2e_s']:.2f} | {r['p99_e2e_s']:.1f} | "
                     f"{r['mean_ttft_s']:.2f} | {r['preemptions']:.1f} |")
    lines += ["", "| capacity-aware vs blind | engine | blind mean E2E (s) | aware mean E2E (s) | gain |",
              "|---|---|---:|---:|---:|"]
    by = {(r["router"], r.get("instance_scheduler", "fcfs")): r for r in rows}
    for aware, blind in PAIRS:
        for eng in ("fcfs", "priority"):
            if (aware, eng) in by and (blind, eng) in by:
                a, b = by[(aware, eng)]["mean_e2e_s"], by[(blind, eng)]["mean_e2e_s"]
                lines.append(f"| {aware} vs {blind} | {eng} | {b:.2f} | {a:.2f} | {100 * (b - a) / b:+.1f} % |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("which", choices=["untuned", "f1"])
    ap.add_argument("--trace", default="AzureLLMInferenceTrace_conv.csv")
    ap.add_argument("--rate", type=float, default=None,
                    help="untuned: 15 (picked on the held-out window [3000 s, end), seed 1000); f1: R (65.8, --find-rate)")
    ap.add_argument("--requests", default="1000")
    ap.add_argument("--find-rate", action="store_true", help="f1: search R on seeds 1000-1001 and stop")
    ap.add_argument("--routers", default=ROUTERS)
    ap.add_argument("--jobs", default="1")
    ap.add_argument("--out", default="runs/mixed-fleet")
    a = ap.parse_args()
    common = ["--router", a.routers, "--instance-scheduler", "fcfs,priority", "--predictor", "noisy:0.79",
              "--requests", a.requests, "--jobs", a.jobs, "--timeline-interval", "0"]
    if a.which == "untuned":
        # A trace replay is the same arrivals whatever the seed (seeds move only `random` and the noisy predictor),
        # so the five paired runs are five windows of the trace, window k with seed k: every router sees the same.
        rate = a.rate or 15.0
        per = {}
        for k in range(5):
            win = f"{k * WINDOW_S}:{(k + 1) * WINDOW_S}"
            for r in lbbench_json(["--fleet", UNTUNED, "--trace", a.trace, "--max-prompt-tokens", "7168",
                                   "--window", win, "--rate", str(rate), *common, "--seed", str(k),
                                   "--out", f"{a.out}/untuned-w{k}"]):
                per.setdefault((r["router"], r.get("instance_scheduler", "fcfs")), []).append(r)
        rows = []
        for (router, eng), rs in per.items():
            m = [r["mean_e2e_s"] for r in rs]
            rows.append({"router": router, "instance_scheduler": eng, "mean_e2e_s": statistics.mean(m),
                         "mean_e2e_std_s": statistics.stdev(m),
                         **{key: statistics.mean(r[key] for r in rs)
                            for key in ("p50_e2e_s", "p99_e2e_s", "mean_ttft_s", "preemptions", "completed")}})
        print(table(rows, f"H100 + 2 x A100 + L4, Azure conversation, {rate:g} req/s, {a.requests} requests "
                          f"from each of 5 {WINDOW_S}-s windows of the trace"))
        return
    if a.find_rate:
        print(json.dumps(lbbench_json(
            ["--fleet", F1, "--workload", "paper-mix", "--requests", "2000", "--router", "least_requests",
             "--seed", "1000", "--seeds", "2", "--predictor", "noisy:0.79", "--find-rate", "--slo", "ttft=2",
             "--attainment", "0.9", "--find-rate-start", "10", "--out", f"{a.out}/f1-find-rate"])["rows"][0],
            indent=1))
        return
    r = a.rate or 65.8
    for rate, name in ((r, "R"), (round(1.3 * r, 1), "1.3 R")):
        rows = lbbench_json(["--fleet", F1, "--workload", "paper-mix", "--rate", str(rate), *common,
                             "--seeds", "5", "--seed", "0",
                             "--out", f"{a.out}/f1-{rate:g}"])
        print(table(rows, f"F1 (2 x A100 + 2 x L4), paper-mix, {name} = {rate:g} req/s, {a.requests} requests"))
        print()


if __name__ == "__main__":
    main()
