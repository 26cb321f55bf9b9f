"""Replay-client dispatch lag on the mission's top rate, through the one experiment runner.

Starts ``lbbench serve-sim`` (two emulated A100 instances, ``llama3.1-8b-a100-v0``) in its own process, then runs
``lbbench.experiment.run_experiment`` against it ``--repeats`` times: the paper-mix workload at ``--rate``
(default 80 req/s), streaming, ``--requests`` requests, round robin. Each repeat is the same code path as
``lbbench run --endpoint URL --endpoint URL --workload paper-mix --rate 80``.

Prints per repeat: requests recorded (of those sent), dispatch lag (actual - planned send time) p50 / p99 /
max, streamed chunks per second, the client's CPU time and its load workers' (start-up included), the load
average; then the median over repeats.
Target (issue: replay client at 80 req/s): p99 dispatch lag <= 5 ms with every request recorded.

``--load-workers auto`` (the default) is what ``lbbench run`` picks (``lbbench.experiment.config.auto_load_workers``:
one load worker on a machine of two or more cores at 80 req/s); ``--load-workers 0 --stream-workers 0`` is one process.

Usage: python bench/bench_client_lag.py [--rate 80] [--requests 600] [--repeats 3] [--stream-workers 0,2]
       [--load-workers auto,0]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
from bench_load_workers import WorkerCpu  # bench/ is on the path when run as a script
from bench_proxy import wait_healthy

from lbbench.experiment import RunConfig, run_experiment


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _total_cpu_s(sampler: WorkerCpu) -> float:
    """All the CPU time the load workers used, start-up included (their last samples)."""
    sampler.stop.set()
    sampler.thread.join()
    last: dict[int, float] = {}
    for _, cpu in sampler.samples:
        last.update(cpu)
    return sum(last.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=80.0)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=8390)
    ap.add_argument("--stream-workers", default="0", help="comma-separated worker counts, interleaved per repeat")
    ap.add_argument("--load-workers", default="auto",
                    help="comma-separated load worker counts or auto (lbbench run's default), interleaved per repeat")
    args = ap.parse_args()
    urls = [f"http://127.0.0.1:{args.port}", f"http://127.0.0.1:{args.port + 1}"]
    server = subprocess.Popen([sys.executable, "-m", "lbbench.cli", "serve-sim", "--instances", "2",
                               "--profile", "llama3.1-8b-a100-v0", "--port", str(args.port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        for url in urls:
            wait_healthy(url)
        plan = [(rep, int(w), lw) for rep in range(args.repeats) for w in args.stream_workers.split(",")
                for lw in args.load_workers.split(",") if not (int(w) and lw not in ("auto", "0"))]
        for rep, workers, lw in plan:
            cfg = RunConfig(profile="llama3.1-8b-a100-v0", endpoints=urls, workload="paper-mix",
                            rate_per_s=args.rate, requests=args.requests, routers=["round_robin"], seed=rep,
                            stream_workers=workers, load_workers=None if lw == "auto" else int(lw)).resolved()
            workers = f"{workers} stream / {cfg.load_workers} load ({lw})"
            with tempfile.TemporaryDirectory() as tmp:
                cpu0, t0, workers_cpu = _cpu_s(), time.perf_counter(), WorkerCpu()
                out = run_experiment(cfg, Path(tmp) / "run")
                cpu, wall = _cpu_s() - cpu0, time.perf_counter() - t0
                worker_cpu = _total_cpu_s(workers_cpu)
                df = pl.read_parquet(out.path / "requests.parquet")
            lag = (df["actual_send_s"] - df["planned_send_s"]).drop_nulls() * 1000
            chunks = int(df["generated_tokens"].sum())
            span = float(df["finish_s"].max() - df["arrival_s"].min())
            rows.append({"repeat": rep, "workers": workers, "recorded": df.height, "sent": args.requests,
                         "failed": int(df["error"].is_not_null().sum()),
                         "lag_p50_ms": float(lag.quantile(0.5)), "lag_p99_ms": float(lag.quantile(0.99)),
                         "lag_max_ms": float(lag.max()), "tokens_per_s": chunks / span if span > 0 else 0.0,
                         "client_cpu_s": cpu, "worker_cpu_s": worker_cpu, "wall_s": wall, "complete": out.complete})
            r = rows[-1]
            print(f"repeat {rep}, {workers} workers: recorded {r['recorded']}/{r['sent']} (failed {r['failed']}), dispatch lag "
                  f"p50 {r['lag_p50_ms']:.2f} / p99 {r['lag_p99_ms']:.2f} / max {r['lag_max_ms']:.2f} ms, "
                  f"{r['tokens_per_s']:.0f} streamed tokens/s, client CPU {r['client_cpu_s']:.1f} s (load workers "
                  f"{r['worker_cpu_s']:.1f} s, start-up included) over {r['wall_s']:.1f} s, load average "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
    finally:
        server.terminate()
        server.wait(10)
    for workers in sorted({r["workers"] for r in rows}):
        mine = [r for r in rows if r["workers"] == workers]
        med = {k: statistics.median(r[k] for r in mine) for k in ("lag_p50_ms", "lag_p99_ms", "lag_max_ms",
                                                                  "tokens_per_s", "client_cpu_s")}
        print(f"{workers} workers, median of {len(mine)}: dispatch lag p50 {med['lag_p50_ms']:.2f} ms, "
              f"p99 {med['lag_p99_ms']:.2f} ms, max {med['lag_max_ms']:.2f} ms; {med['tokens_per_s']:.0f} "
              f"tokens/s; every request recorded: {all(r['recorded'] == r['sent'] for r in mine)} "
              "(target: p99 <= 5 ms, all recorded)")


if __name__ == "__main__":
    main()
