"""What several bench scripts share: a loaded cluster snapshot and a timing loop; the training workload's
options; the datasets folder, a log line and torch's threads for the predictor benches."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from lbbench.sim.cluster import ClusterSim

#: the shared datasets folder beside the checkout
DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def log(line: str) -> None:
    """A progress line on stderr (stdout keeps the results)."""
    print(line, file=sys.stderr, flush=True)


def torch_one_thread() -> None:
    """Torch, where installed, on one thread."""
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def snapshot_args(ap: argparse.ArgumentParser, profile: str, at_s: float) -> None:
    """The options of ``build_state`` and the timing loop: --profile, --instances, --at-s, --repeats, --seed."""
    ap.add_argument("--profile", default=profile)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--at-s", type=float, default=at_s, help="virtual time of the snapshot")
    ap.add_argument("--repeats", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)


def train_workload_args(ap: argparse.ArgumentParser, requests: int) -> None:
    """The workload of a ``TrainConfig``: --profile, --instances, --rate, --requests."""
    ap.add_argument("--profile", default="llama2-7b-v100")
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--requests", type=int, default=requests)


def train_config(args: argparse.Namespace, **options):
    """The ``TrainConfig`` of the ``train_workload_args`` options, with ``options`` besides."""
    from lbbench.training.config import TrainConfig

    return TrainConfig(profile=args.profile, instances=args.instances, rate=args.rate, requests=args.requests,
                       **options)


def build_state(profile, num_instances: int, at_s: float, seed: int) -> ClusterSim:
    """Paper-mix at 20 req/s per 4 instances, routed round robin up to ``at_s`` seconds of virtual time, one
    request left waiting at the head of the queue."""
    from lbbench.sim.cluster import ClusterSim
    from lbbench.workloads import paper_mix

    rate = 20.0 * num_instances / 4
    sim = ClusterSim(profile, num_instances, paper_mix(int(rate * (at_s + 5)), rate, seed), seed=seed)
    i = 0
    for r in sim.requests:
        if r.arrival_s > at_s:
            break
        sim.advance(r.arrival_s)
        while len(sim.queue) > 1:  # keep one request waiting: the head the router decides on
            sim.dispatch(0, i % num_instances)
            i += 1
    sim.advance(at_s)
    return sim


def time_calls(fn, repeats: int) -> np.ndarray:
    """Microseconds per call of ``fn``, ``repeats`` calls after a warm-up."""
    for _ in range(min(1000, repeats)):  # warm up
        fn()
    out = np.empty(repeats)
    clock = time.perf_counter_ns
    for k in range(repeats):
        t0 = clock()
        fn()
        out[k] = clock() - t0
    return out / 1000.0
