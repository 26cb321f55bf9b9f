"""Mixed fleet, live against the simulator: the same requests through `lbbench run --fleet` (simulated) and through
`lbbench serve-sim --fleet` + `lbbench run --endpoints` (emulated instances on this host, real HTTP streams).

    python bench/mixed_live_vs_sim.py --out runs/mixed-live            # F1, 4 routers, 2 live repeats

The simulated side runs once per repeat (it is deterministic; running it between live repeats interleaves them),
the live side against one serve-sim process kept up for the whole script; the live router order rotates between
repeats. Prints per router: sim mean E2E, live mean E2E (median of repeats), the difference, TTFT and TBT on both
sides, the live dispatch lag, and the host's load average before each live repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

LBBENCH = [sys.executable, "-m", "lbbench"] if not os.environ.get("LBBENCH") else os.environ["LBBENCH"].split()


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_json(args: list[str]) -> list[dict]:
    out = subprocess.run(LBBENCH + ["run", *args, "--format", "json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def arguments(**defaults: str) -> argparse.ArgumentParser:
    """The script's options (``defaults`` override the mixed fleet's, for ``pd_live_vs_sim.py``)."""
    d = {"fleet": "llama3.1-8b-a100-v0:2,llama3.1-8b-l4-v0:2",
         "routers": "round_robin,weighted_round_robin,least_requests,least_work_speed", "prompt_tokens": "256:0.8",
         "output_tokens": "48:0.8", "rate": "4", "requests": "240", "kv_link": None, **defaults}
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleet", default=d["fleet"])
    ap.add_argument("--routers", default=d["routers"])
    ap.add_argument("--workload", default="poisson")
    ap.add_argument("--prompt-tokens", default=d["prompt_tokens"])
    ap.add_argument("--output-tokens", default=d["output_tokens"])
    ap.add_argument("--rate", default=d["rate"])
    ap.add_argument("--requests", default=d["requests"])
    ap.add_argument("--kv-link", default=d["kv_link"], help="P/D fleets: the link (both sides)")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--port", type=int, default=8310)
    ap.add_argument("--out", required=True)
    return ap


def main() -> None:
    live_vs_sim(arguments().parse_args())


def live_vs_sim(a: argparse.Namespace) -> dict:
    """Run the comparison and print its table; returns what ``result.json`` holds."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--workload", a.workload, "--prompt-tokens", a.prompt_tokens, "--output-tokens", a.output_tokens,
              "--rate", a.rate, "--requests", a.requests, "--seed", a.seed, "--timeline-interval", "0"]
    link = ["--kv-link", a.kv_link] if a.kv_link else []
    routers = a.routers.split(",")

    eps = out / "endpoints.txt"
    server = subprocess.Popen(LBBENCH + ["serve-sim", "--fleet", a.fleet, "--port", str(a.port),
                                         "--endpoints-file", str(eps), *link],
                              stdout=open(out / "serve-sim.log", "w"), stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            if eps.exists() and eps.read_text().strip():
                break
            time.sleep(0.2)
        time.sleep(1.0)
        print("endpoints:", eps.read_text().split(), flush=True)
        sim, live, loads = {}, {r: [] for r in routers}, []
        for rep in range(a.repeats):
            for row in run_json(["--fleet", a.fleet, "--router", a.routers, *common, *link,
                                 "--out", str(out / f"sim-{rep}")]):
                sim[row["router"]] = row
            order = routers[rep % len(routers):] + routers[:rep % len(routers)]
            loads.append(loadavg())
            print(f"repeat {rep}: load average {loads[-1]}, live order {order}", flush=True)
            # --no-saturation-stop: the saturation detector's default (backlog growing by > rate/10 req/s and >= 8
            # requests over 10 s) fires on this light load's fluctuations (the simulator marks the same runs), and a
            # live run would stop sending there; here every request is sent, as in the simulator.
            for row in run_json(["--endpoints", str(eps), "--router", ",".join(order), *common, *link,
                                 "--no-saturation-stop",
                                 "--out", str(out / f"live-{rep}")]):
                live[row["router"]].append(row)
            print(f"repeat {rep} done: load average {loadavg()}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)

    def med(rows, key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(vals) if vals else float("nan")

    result = []
    print("| router | sim mean E2E (s) | live mean E2E (s), median [repeats] | live − sim | sim / live mean TTFT (s) | "
          "sim / live mean TBT (ms) | live dispatch lag p50 / p99 (ms) | failed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in routers:
        s, L = sim[r], live[r]
        le = med(L, "mean_e2e_s")
        reps = ", ".join(f"{x['mean_e2e_s']:.3f}" for x in L)
        print(f"| {r} | {s['mean_e2e_s']:.3f} | {le:.3f} [{reps}] | {100 * (le - s['mean_e2e_s']) / s['mean_e2e_s']:+.1f} % | "
              f"{s['mean_ttft_s']:.3f} / {med(L, 'mean_ttft_s'):.3f} | {1000 * s['mean_tbt_s']:.1f} / "
              f"{1000 * med(L, 'mean_tbt_s'):.1f} | {1000 * med(L, 'dispatch_lag_p50_s'):.1f} / "
              f"{1000 * med(L, 'dispatch_lag_p99_s'):.1f} | {sum(x['failed'] for x in L)} |")
        result.append({"router": r, "sim": s, "live": L})
    rank_sim = sorted(routers, key=lambda r: sim[r]["mean_e2e_s"])
    rank_live = sorted(routers, key=lambda r: med(live[r], "mean_e2e_s"))
    print("ranking sim :", rank_sim)
    print("ranking live:", rank_live, "(agrees)" if rank_sim == rank_live else "(differs)")
    print("load averages before live repeats:", loads)
    doc = {"rows": result, "rank_sim": rank_sim, "rank_live": rank_live, "loadavg": loads, "args": vars(a)}
    (out / "result.json").write_text(json.dumps(doc, indent=1))
    return doc


if __name__ == "__main__":
    main()
