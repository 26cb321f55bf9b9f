"""What several bench scripts share: a loaded cluster snapshot and a timing loop."""

from __future__ import annotations

import time

import numpy as np

from lbbench.sim.cluster import ClusterSim
from lbbench.workloads import paper_mix


def build_state(profile, num_instances: int, at_s: float, seed: int) -> ClusterSim:
    """Paper-mix at 20 req/s per 4 instances, routed round robin up to ``at_s`` seconds of virtual time, one
    request left waiting at the head of the queue."""
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
