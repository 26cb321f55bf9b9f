"""Load workers at a high request rate: dispatch lag, achieved rate and records, per worker.

Starts ``lbbench serve-sim --profile zero`` (two emulated instances whose engine steps take 1 us, so they answer
at once) in its own process, then replays a constant-rate schedule (request *i* at *i/R*, 32 prompt tokens,
``--output-tokens`` streamed output tokens, round robin) with ``run_replay(load_workers=N)`` for each N of
``--workers``, interleaved over ``--repeats``. Prints per run: requests recorded (of those sent), failures,
achieved send rate against the asked one, the dispatch lag (actual - planned send, on the driver's clock) p50 /
p99 / max overall and per worker, and each worker's measured clock offset.

Target (issue 22): 2,000 req/s with 2 load workers: every request recorded, >= 95 % of the asked rate, p99
dispatch lag <= 5 ms. The unit tests of the load workers (``tests/live/test_load_workers.py``) check what they do,
not how fast: the low-rate check they once made, >= 95 % of 80 req/s with 2 workers, is
``--rate 80 --duration 3 --workers 2`` here.

    python bench/bench_load_workers.py [--rate 2000] [--duration 5] [--workers 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_proxy import wait_healthy  # noqa: E402

from lbbench.core import Request  # noqa: E402
from lbbench.engines.vllm.emulator import free_port_range  # noqa: E402
from lbbench.harness.replay import ReplaySettings, run_replay  # noqa: E402
from lbbench.routers import get_router  # noqa: E402


def _proc_cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class WorkerCpu:
    """The CPU time of this process's load workers, sampled every 0.1 s until they exit: what they used after
    the run's clock started (not their start-up and imports)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, dict[int, float]]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(0.1):
            now = {p.pid: _proc_cpu_s(p.pid) for p in multiprocessing.active_children()
                   if p.name.startswith("lbbench-load-")}
            self.samples.append((time.monotonic(), {k: v for k, v in now.items() if v is not None}))

    def used_since_s(self, origin_s: float) -> float:
        self.stop.set()
        self.thread.join()
        base = {}
        for t, cpu in self.samples:
            if t <= origin_s:
                base.update(cpu)
        last = {}
        for _, cpu in self.samples:
            last.update(cpu)
        return sum(v - base.get(k, v) for k, v in last.items())


def one_run(urls: list[str], rate: float, duration_s: float, workers: int, output_tokens: int) -> dict:
    n = int(rate * duration_s)
    reqs = [Request(i, i / rate, 32, output_tokens) for i in range(n)]
    sampler = WorkerCpu()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    # no out_dir: the records go to a temporary folder of the result's own, read back below
    res = run_replay(reqs, get_router("round_robin", num_instances=len(urls)), urls,
                     ReplaySettings(run_id="bench", seed=0, scrape_interval_s=None, load_workers=workers,
                                    warm_connections=64))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    driver_cpu_s = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    worker_cpu_s = sampler.used_since_s(res.clock_origin_s)
    sends = np.sort([r.actual_send_s for r in res.records if r.actual_send_s is not None])
    lag = np.array([r.actual_send_s - r.planned_send_s for r in res.records
                    if r.actual_send_s is not None and r.planned_send_s is not None]) * 1e3
    achieved = (len(sends) - 1) / (sends[-1] - sends[0]) if len(sends) > 1 else 0.0
    return {"sent": n, "recorded": len(res.records), "unique": len({r.request_id for r in res.records}),
            "failed": sum(r.error is not None for r in res.records), "complete": res.complete,
            "achieved_per_s": achieved, "lag_p50_ms": float(np.percentile(lag, 50)),
            "lag_p99_ms": float(np.percentile(lag, 99)), "lag_max_ms": float(lag.max()),
            "workers": res.load_workers, "driver_cpu_us": 1e6 * driver_cpu_s / n,
            "worker_cpu_us": 1e6 * worker_cpu_s / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals per run")
    ap.add_argument("--workers", default="2", help="comma-separated load worker counts (0: one process)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--output-tokens", type=int, default=4)
    args = ap.parse_args()
    port = free_port_range(2)
    urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
    server = subprocess.Popen([sys.executable, "-m", "lbbench.cli", "serve-sim", "--instances", "2",
                               "--profile", "zero", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ok = True
    try:
        for url in urls:
            wait_healthy(url)
        for rep in range(args.repeats):
            for w in (int(x) for x in args.workers.split(",")):
                r = one_run(urls, args.rate, args.duration, w, args.output_tokens)
                met = (r["recorded"] == r["unique"] == r["sent"] and r["failed"] == 0
                       and r["achieved_per_s"] >= 0.95 * args.rate and r["lag_p99_ms"] <= 5.0)
                ok = ok and met
                print(f"repeat {rep}, {w} load workers, {args.rate:g} req/s: recorded {r['recorded']}/{r['sent']} "
                      f"(unique {r['unique']}, failed {r['failed']}), achieved {r['achieved_per_s']:.0f} req/s "
                      f"({100 * r['achieved_per_s'] / args.rate:.1f} %), dispatch lag p50 {r['lag_p50_ms']:.2f} / "
                      f"p99 {r['lag_p99_ms']:.2f} / max {r['lag_max_ms']:.2f} ms; target "
                      f"{'met' if met else 'missed'}; CPU per request: driver {r['driver_cpu_us']:.0f} us, workers "
                      f"{r['worker_cpu_us']:.0f} us (from the run's start, sampled every 0.1 s)", flush=True)
                for wk in r["workers"]:
                    print(f"    worker {wk['worker']} (pid {wk['pid']}): {wk['requests']} requests, clock offset "
                          f"{wk['clock_offset_ms']:+.4f} ms (+/- {wk['clock_error_ms']:.4f}), lag p50 "
                          f"{wk['lag_p50_ms']:.2f} / p99 {wk['lag_p99_ms']:.2f} ms", flush=True)
    finally:
        server.terminate()
        server.wait(10)
    print(f"target (every request recorded, >= 95 % of the asked rate, p99 lag <= 5 ms): "
          f"{'met' if ok else 'missed'} in every run")


if __name__ == "__main__":
    main()
