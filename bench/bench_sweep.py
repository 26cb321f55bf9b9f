"""A 72-unit simulated sweep, as users run it: one process, a local process pool, and Ray tasks on 1 or 2 nodes.

The sweep: 4 rates x 3 routers x 2 instance schedulers x 3 seeds = 72 units of 2000 requests each, on
4 x llama2-7b-v100 with the paper's task mix. Each mode is one ``lbbench run`` command (a fresh process, as a
user types it), repeated and interleaved (serial, --jobs 2, --ray, serial, ...) so that load from elsewhere on
the machine falls on every mode alike; the figures are medians. Modes:

- ``serial``: ``--jobs 1``;
- ``jobs2``: ``--jobs 2`` (a spawn process pool);
- ``ray1``: ``--ray auto`` against a one-node Ray cluster this script starts (a head with 2 CPUs);
- ``ray2``: the same against a two-node cluster (a head with 1 CPU and a second node with 1 CPU, on the same
  machine: the same CPUs as ``ray1``, so the difference is the mechanism — tasks, results and the driver's
  traffic crossing nodes — not more hardware). ``run.toml`` says which node ran each unit: the units per node
  are printed.

``--nodes 1``, ``2`` or ``1,2`` picks the Ray modes. The clusters are started with
``lbbench.distributed.ray_cluster.start_head``/``start_worker`` (``ray start ... --block`` processes, every node
on a loopback address, a temp dir and a token of their own) and stopped at the end; ``RAY_ADDRESS`` points
``auto`` at them. ``--address`` uses a running cluster instead (one Ray mode, ``ray``).

It checks that every mode wrote the same records (``requests.parquet`` without ``run_id``), prints wall times
(the command's and ``run.toml``'s ``wall_s``, which leaves out interpreter start-up and imports), the per-unit
time (each unit once more in this process, timed alone), the overhead of each mode against perfect division
of the serial work, and a projection to 16 and 64 CPUs.

The projection is on paper, not measured: T(N) = overhead + makespan of the executor's batches (consecutive
units, ``auto_batch_size``) list-scheduled on N workers with the measured per-unit times; the overhead is the
one measured with Ray on this machine, assumed constant (it is not: more tasks and nodes cost more to
schedule, and a cluster adds network transfers). Usage:

    python bench/bench_sweep.py [--repeats 3] [--requests 2000] [--nodes 1,2] [--modes serial,jobs2,ray]
                                [--address HOST:PORT]
"""

from __future__ import annotations

import argparse
import heapq
import os
import shutil
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


def start_cluster(nodes: int):
    """A Ray cluster of ``nodes`` nodes here with 2 CPUs in all (``ray_cluster.start_head``/``start_worker``)."""
    from lbbench.distributed import ray_cluster

    cluster = ray_cluster.start_head(2 if nodes == 1 else 1, name="head")
    try:
        for k in range(1, nodes):
            ray_cluster.start_worker(cluster, 1, name=f"node{k}")
    except BaseException:
        ray_cluster.stop(cluster)
        raise
    return cluster


def run_mode(mode: str, requests: int, out: Path, ray_env: dict[str, str] | None) -> tuple[float, float, dict]:
    """(command wall s, run.toml wall_s, units per node) of one ``lbbench run``."""
    extra = {"serial": ["--jobs", "1"], "jobs2": ["--jobs", "2"]}.get(mode, ["--ray", "auto"])
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if mode.startswith("ray"):
        env.update(ray_env or {})  # RAY_ADDRESS (and the cluster's token file: lbbench sees that it asks for one)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "lbbench.cli", *sweep_args(requests), *extra, "--out", str(out)],
                         capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{mode} failed ({res.returncode}): {res.stderr[-2000:]}")
    doc = tomllib.loads((out / "run.toml").read_text())
    return wall, doc["wall_s"], {row["node"]: row["units"] for row in doc.get("ray_nodes", [])}


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
    ap.add_argument("--nodes", default="1", help="Ray clusters to start: 1, 2 or 1,2 (modes ray1, ray2)")
    ap.add_argument("--modes", default="serial,jobs2,ray",
                    help="modes to run, in this order: serial, jobs2, ray (the Ray modes --nodes gives)")
    ap.add_argument("--address", default=None, help="use this running Ray cluster instead of starting one")
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    ap.add_argument("--no-projection", dest="projection", action="store_false",
                    help="skip timing each unit alone and the projection to 16 and 64 CPUs")
    args = ap.parse_args()

    from lbbench.distributed import ray_cluster

    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    wanted = args.modes.split(",")
    node_counts = [int(n) for n in args.nodes.split(",")] if "ray" in wanted else []
    if any(n not in (1, 2) for n in node_counts):
        raise SystemExit("--nodes: 1, 2 or 1,2")
    ray_modes = (["ray"] if args.address else [f"ray{n}" for n in node_counts]) if "ray" in wanted else []
    modes = [m for m in wanted if m != "ray"] + ray_modes
    clusters: dict[str, object] = {}
    ray_envs: dict[str, dict[str, str]] = {"ray": {"RAY_ADDRESS": args.address or ""}}
    load_before = os.getloadavg()[0]
    walls: dict[str, list[float]] = {m: [] for m in modes}
    run_walls: dict[str, list[float]] = {m: [] for m in modes}
    per_node: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        for n in node_counts if not args.address else []:
            print(f"starting a {n}-node Ray cluster on loopback (2 CPUs in all) ...", flush=True)
            t0 = time.perf_counter()
            c = clusters[f"ray{n}"] = start_cluster(n)
            ray_envs[f"ray{n}"] = c.client_env()
            print(f"  up in {time.perf_counter() - t0:.1f} s at {c.address}", flush=True)
        for rep in range(args.repeats):
            for mode in modes:
                w, rw, nodes = run_mode(mode, args.requests, work / f"{mode}-{rep}", ray_envs.get(mode))
                walls[mode].append(w)
                run_walls[mode].append(rw)
                per_node[mode].append(nodes)
                shown = "" if not nodes else "  units per node: " + ", ".join(f"{k} {v}" for k, v in nodes.items())
                print(f"  repeat {rep + 1} {mode:6s} command {w:6.1f} s, run {rw:6.1f} s{shown}", flush=True)
        ref = pl.read_parquet(work / f"{modes[0]}-0" / "requests.parquet").drop("run_id")
        same = all(pl.read_parquet(work / f"{m}-{r}" / "requests.parquet").drop("run_id").equals(ref)
                   for m in modes for r in range(args.repeats))
        times = unit_times(args.requests)[0] if args.projection else []
    finally:
        for c in clusters.values():
            ray_cluster.stop(c)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)

    med = {m: statistics.median(walls[m]) for m in modes}
    rmed = {m: statistics.median(run_walls[m]) for m in modes}
    print(f"\nsweep: {RATES} req/s x {ROUTERS} x {SCHEDULERS} x {SEEDS} seeds, "
          f"{args.requests} requests, 4 x llama2-7b-v100 paper-mix; {args.repeats} interleaved repeats, medians; "
          f"this machine: {os.cpu_count()} CPUs")
    print(f"records identical across modes and repeats: {same}")
    load = max(load_before, os.getloadavg()[0])
    print(f"load average (1 min) at start {load_before:.1f}, at end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
          + ("" if load < (os.cpu_count() or 1) else
             ": the machine was busy with other work, so speed-ups, overheads and the projection below measure "
             "that contention more than the executors; rerun on a quiet machine"))
    base = modes[0]
    print(f"{'mode':8s} {'command s':>10s} {'run s':>8s} {'vs ' + base:>9s}  units per node (each repeat)")
    for m in modes:
        nodes = "; ".join(", ".join(f"{k} {v}" for k, v in n.items()) for n in per_node[m]) or "-"
        print(f"{m:8s} {med[m]:10.1f} {rmed[m]:8.1f} {rmed[base] / rmed[m]:9.2f}  {nodes}")
    if "ray1" in med and "ray2" in med:
        print(f"2 nodes / 1 node (same 2 CPUs): command {med['ray2'] / med['ray1']:.2f}, "
              f"run {rmed['ray2'] / rmed['ray1']:.2f}")
    ray_mode = next((m for m in ("ray", "ray1", "ray2") if m in med), None)
    if ray_mode and "jobs2" in med:
        print(f"{ray_mode} / jobs2 (command wall): {med[ray_mode] / med['jobs2']:.2f} (target <= 1.3); by run wall: "
              f"{rmed[ray_mode] / rmed['jobs2']:.2f}")
    if not times or ray_mode is None:
        return
    units = len(times)
    t_sum = sum(times)
    print(f"per unit (alone, in one process): mean {t_sum / units:.3f} s, min {min(times):.3f}, "
          f"max {max(times):.3f}; all {units} units {t_sum:.1f} s")
    for m in modes:
        cpus = 1 if m == "serial" else 2
        print(f"  {m}: overhead {rmed[m] - makespan(times, cpus):.1f} s (run wall less the {cpus}-CPU makespan)")
    overhead = med[ray_mode] - makespan(times, 2)
    print(f"\nprojection on paper (not measured): T(N) = {overhead:.1f} s Ray overhead measured here ({ray_mode}: "
          "command wall less the 2-CPU makespan; assumed constant) + the makespan of the batches on N CPUs")
    for n in (2, 16, 64):
        t = overhead + makespan(times, n)
        print(f"  {n:3d} CPUs: {t:6.1f} s  ({med[base] / t:5.1f}x the {base} command)")
    big = times * (1050 // units + 1)
    big = big[:1050]
    for n in (16, 64):
        print(f"  1,050 units (the issue's nightly matrix) on {n} CPUs: {overhead + makespan(big, n):6.1f} s "
              f"(serial about {sum(big):.0f} s)")


if __name__ == "__main__":
    main()
