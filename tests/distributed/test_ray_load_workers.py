"""Load workers as Ray actors: the same replay, the workers living in Ray's processes, clock offsets measured,
each worker's node named."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

from lbbench.core import Request
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig, zero_latency_profile
from lbbench.harness.replay import ReplaySettings, run_replay
from lbbench.routers import get_router


def test_load_workers_as_ray_actors(ray_session):
    rng = np.random.default_rng(11)
    t = np.cumsum(rng.exponential(1 / 60.0, 120))
    reqs = [Request(i, float(t[i]), int(rng.integers(8, 64)), int(rng.integers(2, 16))) for i in range(120)]
    with EmulatorFleet(FleetConfig(zero_latency_profile(), 2)) as fleet:
        res = run_replay(reqs, get_router("least_requests", num_instances=2), fleet.endpoints,
                         ReplaySettings(run_id="ray", seed=0, load_workers=2, ray=True, scrape_interval_s=None))
    assert res.complete and sorted(r.request_id for r in res.records) == list(range(len(reqs)))
    assert all(r.error is None and r.generated_tokens == q.output_tokens for r, q in
               zip(sorted(res.records, key=lambda r: r.request_id), reqs))
    pids = {w["pid"] for w in res.load_workers}
    assert len(pids) == 2 and os.getpid() not in pids
    assert not pids & {p.pid for p in multiprocessing.active_children()}  # Ray's processes, not ours
    for w in res.load_workers:
        assert w["requests"] > 0 and abs(w["clock_offset_ms"]) <= w["clock_error_ms"] + 1e-6
    # each worker names its Ray node as a Ray sweep's run.toml names a unit's (here the one node, by its address)
    assert [w["node"] for w in res.load_workers] == [ray_session.nodes()[0]["NodeManagerAddress"]] * 2
