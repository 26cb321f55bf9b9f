"""What `lbbench proxy` costs: added latency over a direct request, and non-streaming throughput.

Against four zero-latency emulated backends (`lbbench serve-sim --profile zero`, steps of 1 us) and the gateway
(`lbbench proxy`), each in its own process as a user runs them: sequential non-streaming requests direct and
through the gateway, interleaved, medians of the difference; then N concurrent clients through the gateway for a
fixed time (requests per second).

    python bench/bench_proxy.py [--requests 400] [--concurrency 64] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))



async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", data=body,
                            headers={"Content-Type": "application/json"}) as resp:
        await resp.read()
        assert resp.status == 200, resp.status
    return time.perf_counter() - t0


async def added_latency(direct: str, proxied: str, body: bytes, n: int) -> dict:
    async with aiohttp.ClientSession() as s:
        for _ in range(20):
            await _one(s, direct, body)
            await _one(s, proxied, body)
        d, p = [], []
        for _ in range(n):
            d.append(await _one(s, direct, body))
            p.append(await _one(s, proxied, body))
    return {"direct_p50_ms": statistics.median(d) * 1e3, "proxy_p50_ms": statistics.median(p) * 1e3,
            "added_p50_ms": statistics.median([b - a for a, b in zip(d, p)]) * 1e3}


async def throughput(url: str, body: bytes, concurrency: int, seconds: float) -> dict:
    done = 0
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def worker():
            nonlocal done
            while time.perf_counter() < stop:
                await _one(s, url, body)
                done += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"requests": done, "requests_per_s": done / wall, "concurrency": concurrency}


def wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    import urllib.request
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not healthy after {timeout_s:g}s")


@contextlib.contextmanager
def gateway(profile: str, router: str, instances: int = 4, serve_args: tuple[str, ...] = ()
            ) -> Iterator[tuple[list[str], str]]:
    """``lbbench serve-sim`` (``instances`` emulated backends of ``profile``) and ``lbbench proxy``
    in front of them, each its own process; yields (backend URLs, gateway URL) once all are healthy
    and stops them on exit."""
    import subprocess

    from lbbench.engines.vllm.emulator import free_port, free_port_range

    lb = [sys.executable, "-m", "lbbench.cli"]
    base = free_port_range(instances)
    backends = [f"http://127.0.0.1:{base + i}" for i in range(instances)]
    gw_port = free_port()
    procs = [subprocess.Popen(lb + ["serve-sim", "--profile", profile, "--instances", str(instances),
                                    "--port", str(base), *serve_args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for u in backends:
            wait_healthy(u)
        cmd = lb + ["proxy", "--port", str(gw_port), "--router", router]
        for u in backends:
            cmd += ["--endpoint", u]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        gw = f"http://127.0.0.1:{gw_port}"
        wait_healthy(gw)
        yield backends, gw
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


def main() -> None:

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    with gateway("zero", "round_robin") as (backends, gw):
        model = json.loads(__import__("urllib.request").request.urlopen(backends[0] + "/v1/models").read())
        body = json.dumps({"model": model["data"][0]["id"], "prompt": [1, 2, 3, 4], "max_tokens": 1}).encode()
        lat = asyncio.run(added_latency(backends[0], gw, body, args.requests))
        thr = asyncio.run(throughput(gw, body, args.concurrency, args.seconds))
    print(f"added latency (non-streaming, 1 output token, {args.requests} interleaved pairs): "
          f"direct p50 {lat['direct_p50_ms']:.3f} ms, via proxy p50 {lat['proxy_p50_ms']:.3f} ms, "
          f"median added {lat['added_p50_ms']:.3f} ms")
    print(f"throughput via proxy: {thr['requests_per_s']:.0f} req/s non-streaming "
          f"({thr['concurrency']} concurrent clients, {thr['requests']} requests; client, gateway and backends "
          "are three processes on this machine)")


if __name__ == "__main__":
    main()
