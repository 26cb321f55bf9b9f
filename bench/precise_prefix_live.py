"""Precise against approximate prefix routing, live: ``precise_prefix`` fed by serve-sim's KV events over ZMQ
(``lbbench run --kv-events``) beside ``prefix_load`` (the same 3/2/2 scorers on the router's own guess of the
caches) and ``round_robin``, on emulated instances.

Setup: 4 emulated instances (``lbbench serve-sim --profile bench/data/llama3.1-8b-a100-v1.toml --prefix-caching on
--kv-events-port-base``; the profile is physics-derived: vLLM V1 scheduler, chunked prefill, a 2,048-token budget),
inference-perf's shared-prefix traffic (16 groups x 4 users, 2,048-token system prompts, 128-token questions,
64-token answers, Poisson) at 12 req/s, 240 requests, seed 0. Every run gets a fresh serve-sim (cold caches), and
the routers run interleaved, ``--repeats`` rounds with the order rotated each round (the host is noisy: numbers are
live-emulated, measured on this machine's client and emulator). Prints one markdown row per router: median over
the rounds of the mean TTFT, p99 TTFT and mean E2E, with their min-max.

Usage: python bench/precise_prefix_live.py [--repeats 3] [--requests 240]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from lbbench.engines.vllm.emulator import free_port_range

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "bench" / "data" / "llama3.1-8b-a100-v1.toml"
WORKLOAD = "inference-perf:groups=16,users=4,system=2048,question=128,output=64,arrival=poisson"
ROUTERS = {"precise_prefix": ["--router", "precise_prefix"],
           "precise_prefix, event lag 1 s": ["--router", "precise_prefix",
                                             "--router-opt", "precise_prefix.event_lag_s=1.0"],
           "prefix_load": ["--router", "prefix_load"],
           "round_robin": ["--router", "round_robin"]}
INSTANCES = 4


def one_run(label: str, requests: int, rate: float, out: Path) -> dict:
    port, kv = free_port_range(INSTANCES), free_port_range(INSTANCES)
    py = sys.executable
    serve = subprocess.Popen([py, "-m", "lbbench", "serve-sim", "--profile", str(PROFILE), "--instances",
                              str(INSTANCES), "--port", str(port), "--prefix-caching", "on",
                              "--kv-events-port-base", str(kv)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, start_new_session=True)
    try:
        for _ in range(INSTANCES):
            serve.stdout.readline()  # one URL a line once the fleet is up
        eps: list[str] = []
        for i in range(INSTANCES):
            eps += ["--endpoint", f"http://127.0.0.1:{port + i}", "--kv-events", f"tcp://127.0.0.1:{kv + i}"]
        subprocess.run([py, "-m", "lbbench", "run", *eps, "--profile", str(PROFILE), "--workload", WORKLOAD,
                        "--rate", str(rate), "--requests", str(requests), *ROUTERS[label], "--out", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(30)
    rec = pl.read_parquet(out / "requests.parquet").filter(pl.col("error").is_null()).with_columns(
        ttft_s=pl.col("first_token_s") - pl.col("arrival_s"), e2e_s=pl.col("finish_s") - pl.col("arrival_s"))
    return {"router": label, "mean_ttft_s": rec["ttft_s"].mean(), "p99_ttft_s": rec["ttft_s"].quantile(0.99),
            "mean_e2e_s": rec["e2e_s"].mean(), "num_ok": rec.height}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--rate", type=float, default=12.0)
    args = ap.parse_args()
    labels = list(ROUTERS)
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            order = labels[k % len(labels):] + labels[:k % len(labels)]
            for j, label in enumerate(order):
                row = one_run(label, args.requests, args.rate, Path(tmp) / f"r{k}-{j}")
                print(f"round {k}: {row}", file=sys.stderr, flush=True)
                rows.append(row)
    df = pl.DataFrame(rows)
    print(f"| router | mean TTFT (s) | p99 TTFT (s) | mean E2E (s) |  ({args.repeats} rounds, "
          f"{time.perf_counter() - t0:.0f} s)")
    print("|---|---:|---:|---:|")
    for label in labels:
        g = df.filter(pl.col("router") == label)
        cells = [f"{g[c].median():.3f} ({g[c].min():.3f}-{g[c].max():.3f})"
                 for c in ("mean_ttft_s", "p99_ttft_s", "mean_e2e_s")]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
