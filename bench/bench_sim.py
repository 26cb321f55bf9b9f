"""Simulator speed on the paper episode: 4 x llama2-7b-v100, paper-mix, 2000 requests, 20 req/s.

Prints simulated seconds per CPU second and per wall second (x real time) and requests
per wall second, as medians over repeated runs of the same episode. The target is
>= 2000x real time by CPU time (``time.process_time``, the fairer figure on a shared
machine) with prefix caching off. Records must stay identical when the simulator is
made faster: ``bench/sim_golden.py`` checks them. Usage:
python bench/bench_sim.py [--repeats N] [--router NAME] [--prefix-caching off|on|both]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from lbbench.predict import annotate, load_predictor
from lbbench.profiles import load_profile
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads import paper_mix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--router", default="round_robin")
    ap.add_argument("--profile", default="llama2-7b-v100")
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--prefix-caching", choices=("off", "on", "both"), default="both")
    args = ap.parse_args()
    prof = load_profile(args.profile)
    reqs = annotate(paper_mix(args.requests, args.rate, 0), load_predictor("oracle", profile=prof))
    for caching in ((False, True) if args.prefix_caching == "both" else (args.prefix_caching == "on",)):
        measure(args, prof, reqs, caching)


def measure(args: argparse.Namespace, prof, reqs, caching: bool) -> None:
    speed, rps, walls, cpus = [], [], [], []
    for _ in range(args.repeats):
        sim = ClusterSim(prof, args.instances, reqs, prefix_caching=caching)
        router = get_router(args.router, num_instances=args.instances, seed=0, profile=prof)
        t0, c0 = time.perf_counter(), time.process_time()
        recs = sim.run(router)
        wall = time.perf_counter() - t0
        cpus.append(time.process_time() - c0)
        span = max(r.finish_s for r in recs if r.finish_s is not None) - min(r.arrival_s for r in recs)
        walls.append(wall)
        speed.append(span / wall)
        rps.append(len(recs) / wall)
    print(f"simulator: {args.instances} x {args.profile}, paper-mix, {args.requests} requests at {args.rate} req/s, "
          f"router {args.router}, prefix caching {'on' if caching else 'off'}, {args.repeats} repeats")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"  host load           {load:10.2f} (1-minute load average on {os.cpu_count()} CPUs, after the runs)")
    print(f"  simulated span      {span:10.1f} s")
    print(f"  wall per episode    {statistics.median(walls) * 1000:10.1f} ms (median; min {min(walls) * 1000:.1f})")
    print(f"  CPU per episode     {statistics.median(cpus) * 1000:10.1f} ms (median; process time, less "
          "sensitive to other load on the machine)")
    print(f"  speed by CPU time   {span / statistics.median(cpus):10.0f} x real time")
    print(f"  speed               {statistics.median(speed):10.0f} x real time (median; max {max(speed):.0f})")
    print(f"  requests per second {statistics.median(rps):10.0f} (median)")


if __name__ == "__main__":
    main()
