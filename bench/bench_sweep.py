"""A 72-unit simulated sweep, as users run it: one process, a local process pool, and Ray tasks.

The sweep: 4 rates x 3 routers x 2 instance schedulers x 3 seeds = 72 units of 2000 requests each, on
4 x llama2-7b-v100 with the paper's task mix. Each mode is one ``lbbench run`` command (a fresh process, as a
user types it), repeated and interleaved (serial, --jobs 2, --ray, serial, ...) so that load from elsewhere on
the machine falls on every mode alike; the figures are medians. Modes:

- ``serial``: ``--jobs 1``;
- ``jobs2``: ``--jobs 2`` (a spawn process pool);
- ``ray``: ``--ray auto`` against a Ray head this script starts (``ray start --head --num-cpus 2 --block``,
  stopped at the end; ``RAY_ADDRESS`` points ``auto`` at it). ``--address`` uses a running cluster instead.

It checks that every mode wrote the same records (``requests.parquet`` without ``run_id``), prints wall times
(the command's and ``run.toml``'s ``wall_s``, which leaves out interpreter start-up and imports), the per-unit
time (each unit once more in this process, timed alone), the overhead of each mode against perfect division
of the serial work, and a projection to 16 and 64 CPUs.

The projection is on paper, not measured: T(N) = overhead + makespan of the executor's batches (consecutive
units, ``auto_batch_size``) list-scheduled on N workers with the measured per-unit times; the overhead is the
one measured with Ray on this machine, assumed constant (it is not: more tasks and nodes cost more to
schedule, and a cluster adds network transfers). Usage:

    python bench/bench_sweep.py [--repeats 3] [--requests 2000] [--address HOST:PORT]
"""

from __future__ import annotations

import argparse
import heapq
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import polars as pl

RATES = "10,15,20,25"
ROUTERS = "round_robin,jsq,min_min"
SCHEDULERS = "fcfs,least_work_left"
SEEDS = 3


def sweep_args(requests: int) -> list[str]:
    return ["run", "--profile", "llama2-7b-v100", "--instances", "4", "--workload", "paper-mix", "--rate", RATES,
            "--router", ROUTERS, "--instance-scheduler", SCHEDULERS, "--seeds", str(SEEDS), "--requests",
            str(requests), "--format", "json", "--timeline-interval", "1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(num_cpus: int, log: Path) -> tuple[subprocess.Popen, str]:
    """A Ray head on this machine, in the foreground of a child process (terminating it stops the head)."""
    import ray.util

    ray_bin = Path(sys.executable).with_name("ray")
    port = free_port()
    with open(log, "w") as f:
        proc = subprocess.Popen([str(ray_bin), "start", "--head", "--num-cpus", str(num_cpus), "--port", str(port),
                                 "--include-dashboard", "false", "--block", "--disable-usage-stats"],
                                stdout=f, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline:
        if "Ray runtime started" in log.read_text():
            return proc, f"{ray.util.get_node_ip_address()}:{port}"
        if proc.poll() is not None:
            raise SystemExit(f"ray start --head exited: {log.read_text()[-1000:]}")
        time.sleep(1)
    stop_head(proc)
    raise SystemExit("the Ray head did not come up in 300 s")


def stop_head(proc: subprocess.Popen) -> None:
    proc.terminate()  # `ray start --block` stops the head's processes on SIGTERM
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_mode(mode: str, requests: int, out: Path, ray_address: str | None) -> tuple[float, float]:
    """(command wall s, run.toml wall_s) of one ``lbbench run``."""
    extra = {"serial": ["--jobs", "1"], "jobs2": ["--jobs", "2"], "ray": ["--ray", "auto"]}[mode]
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    if mode == "ray":
        env["RAY_ADDRESS"] = ray_address or ""
        # Ray sends this machine's token (~/.ray/auth_token) to an address it is given only when told to
        env.setdefault("RAY_AUTH_MODE", "token")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "lbbench.cli", *sweep_args(requests), *extra, "--out", str(out)],
                         capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{mode} failed ({res.returncode}): {res.stderr[-2000:]}")
    return wall, tomllib.loads((out / "run.toml").read_text())["wall_s"]


def unit_times(requests: int) -> tuple[list[float], list[str]]:
    """Each unit of the sweep run alone in this process: (seconds, labels), in unit order."""
    from lbbench.experiment import RunConfig, works
    from lbbench.experiment.backends import SimBackend
    from lbbench.profiles import load_profile

    cfg = RunConfig(profile="llama2-7b-v100", instances=4, workload="paper-mix",
                    rates=[float(r) for r in RATES.split(",")], requests=requests, routers=ROUTERS.split(","),
                    instance_schedulers=SCHEDULERS.split(","), seeds=SEEDS).resolved()
    units = works(cfg, load_profile(cfg.profile), "bench")
    times = []
    for w in units:
        t0 = time.perf_counter()
        SimBackend().run(w)
        times.append(time.perf_counter() - t0)
    return times, [w.label for w in units]


def makespan(times: list[float], num_cpus: int) -> float:
    """The executor's batches (consecutive units) list-scheduled in order on ``num_cpus`` workers."""
    from lbbench.distributed import auto_batch_size, batches

    work = [sum(times[i] for i in r) for r in batches(len(times), auto_batch_size(len(times), num_cpus))]
    free = [0.0] * num_cpus
    for w in work:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--address", default=None, help="use this running Ray cluster instead of starting a head")
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    args = ap.parse_args()

    head = None
    address = args.address
    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    if address is None:
        print("starting a Ray head (ray start --head --num-cpus 2) ...", flush=True)
        head, address = start_head(2, work / "ray-head.log")
    modes = ["serial", "jobs2", "ray"]
    load_before = os.getloadavg()[0]
    walls: dict[str, list[float]] = {m: [] for m in modes}
    run_walls: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for rep in range(args.repeats):
            for mode in modes:
                w, rw = run_mode(mode, args.requests, work / f"{mode}-{rep}", address)
                walls[mode].append(w)
                run_walls[mode].append(rw)
                print(f"  repeat {rep + 1} {mode:6s} command {w:6.1f} s, run {rw:6.1f} s", flush=True)
        ref = pl.read_parquet(work / "serial-0" / "requests.parquet").drop("run_id")
        same = all(pl.read_parquet(work / f"{m}-{r}" / "requests.parquet").drop("run_id").equals(ref)
                   for m in modes for r in range(args.repeats))
        times, _labels = unit_times(args.requests)
    finally:
        if head is not None:
            stop_head(head)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)

    units = len(times)
    med = {m: statistics.median(walls[m]) for m in modes}
    rmed = {m: statistics.median(run_walls[m]) for m in modes}
    t_sum = sum(times)
    print(f"\nsweep: {units} units ({RATES} req/s x {ROUTERS} x {SCHEDULERS} x {SEEDS} seeds), "
          f"{args.requests} requests, 4 x llama2-7b-v100 paper-mix; {args.repeats} interleaved repeats, medians; "
          f"this machine: {os.cpu_count()} CPUs")
    print(f"records identical across modes and repeats: {same}")
    load = max(load_before, os.getloadavg()[0])
    print(f"load average (1 min) at start {load_before:.1f}, at end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
          + ("" if load < (os.cpu_count() or 1) else
             ": the machine was busy with other work, so speed-ups, overheads and the projection below measure "
             "that contention more than the executors; rerun on a quiet machine"))
    print(f"per unit (alone, in one process): mean {t_sum / units:.3f} s, min {min(times):.3f}, "
          f"max {max(times):.3f}; all units {t_sum:.1f} s")
    print(f"{'mode':8s} {'command s':>10s} {'run s':>8s} {'speed-up':>9s} {'overhead s':>11s}")
    for m in modes:
        cpus = 1 if m == "serial" else 2
        overhead = rmed[m] - makespan(times, cpus)
        print(f"{m:8s} {med[m]:10.1f} {rmed[m]:8.1f} {rmed['serial'] / rmed[m]:9.2f} {overhead:11.1f}")
    ratio = med["ray"] / med["jobs2"]
    print(f"ray / jobs2 (command wall): {ratio:.2f} (target <= 1.3); by run wall: {rmed['ray'] / rmed['jobs2']:.2f}")
    overhead = med["ray"] - makespan(times, 2)
    print(f"\nprojection on paper (not measured): T(N) = {overhead:.1f} s Ray overhead measured here (command wall "
          "less the 2-CPU makespan; assumed constant) + the makespan of the batches on N CPUs")
    for n in (2, 16, 64):
        t = overhead + makespan(times, n)
        print(f"  {n:3d} CPUs: {t:6.1f} s  ({med['serial'] / t:5.1f}x the serial command)")
    big = times * (1050 // units + 1)
    big = big[:1050]
    for n in (16, 64):
        print(f"  1,050 units (the issue's nightly matrix) on {n} CPUs: {overhead + makespan(big, n):6.1f} s "
              f"(serial about {sum(big):.0f} s)")


if __name__ == "__main__":
    main()
