"""`lbbench proxy` losing a backend mid-run: which client requests fail.

Four emulated A100 instances (`lbbench serve-sim --allow-kill`, each timed by the simulator) behind `lbbench proxy`,
each in its own process as a user runs them. `lbbench.experiment.run_experiment` replays a streaming Poisson
workload through the proxy (one endpoint: the proxy); ``--kill-at`` seconds in, the bench reads the proxy's
per-backend in-flight gauge and crashes backend 2 (`POST /lbbench/kill`: it drops every open connection).

Prints the requests sent, those that failed at the client — split into those that had already streamed tokens
(they were streaming on the killed backend: the client holds part of an answer, so the proxy cannot retry them) and
those that had not — and the proxy's in-flight gauge for the killed backend read just before the kill (the crash
follows the kill request by 50 ms, so a request dispatched in between is streaming there too). Target (issue 14):
no client errors beyond the requests already streaming on it, i.e. none that failed before its first token: the
proxy routes every later request to the three live backends, and retries one that failed before its first byte.

    python bench/bench_proxy_failover.py [--rate 20] [--requests 400] [--kill-at 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import re
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import polars as pl

from bench_proxy import gateway  # bench/ is on the path when run as a script

from lbbench.experiment import RunConfig, run_experiment


def _in_flight(gateway: str, backend: str) -> int:
    text = urllib.request.urlopen(gateway + "/metrics", timeout=5).read().decode()
    m = re.search(r'lbbench_proxy_backend_in_flight\{backend="' + re.escape(backend) + r'"\} (\d+)', text)
    return int(m.group(1)) if m else -1


def one_run(args: argparse.Namespace, seed: int) -> dict:
    killed: dict = {}
    with gateway("llama3.1-8b-a100-v0", "least_requests", serve_args=("--allow-kill",)) as (backends, gw):
        def kill() -> None:
            killed["in_flight"] = _in_flight(gw, backends[2])
            urllib.request.urlopen(urllib.request.Request(backends[2] + "/lbbench/kill", method="POST"), timeout=5)
            killed["at"] = time.monotonic()

        cfg = RunConfig(profile="llama3.1-8b-a100-v0", endpoints=[gw], workload="poisson", rate_per_s=args.rate,
                        requests=args.requests, prompt_tokens="256", output_tokens="128:0.5",
                        routers=["round_robin"], seed=seed, timeline_interval_s=None)
        timer = threading.Timer(args.kill_at, kill)
        with tempfile.TemporaryDirectory() as tmp:
            timer.start()
            out = run_experiment(cfg, Path(tmp) / "run")
            timer.join()
            df = pl.read_parquet(out.path / "requests.parquet")
    failed = df.filter(pl.col("error").is_not_null())
    return {"sent": args.requests, "recorded": df.height, "failed": failed.height,
            "failed_streaming": failed.filter(pl.col("first_token_s").is_not_null()).height,
            "in_flight_on_killed": killed.get("in_flight", -1),
            "first_error": failed["error"][0][:120] if failed.height else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--kill-at", type=float, default=5.0, help="seconds into the replay")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ok = True
    for seed in range(args.repeats):
        r = one_run(args, seed)
        ok = ok and r["failed"] == r["failed_streaming"] and r["recorded"] == r["sent"]
        print(f"seed {seed}: {r['recorded']}/{r['sent']} recorded, {r['failed']} failed at the client "
              f"({r['failed_streaming']} of them had streamed tokens, {r['failed'] - r['failed_streaming']} had not); "
              f"the gauge read {r['in_flight_on_killed']} in flight on the killed backend just before the kill"
              + (f" (first error: {r['first_error']})" if r["failed"] else ""), flush=True)
    print(f"target (every client error was already streaming on the killed backend, every request recorded): "
          f"{'met' if ok else 'missed'} in {args.repeats} runs")


if __name__ == "__main__":
    main()
