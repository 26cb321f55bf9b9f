"""Load workers against emulated instances over real HTTP: every request sent and recorded once, worker ids and
clock offsets on the records; a worker that dies; the CLI end to end. The rate they keep is a timing figure,
measured by ``bench/bench_load_workers.py``."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
import tomllib

import numpy as np
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.core import Request
from lbbench.experiment.config import auto_load_workers
from lbbench.harness.replay import ReplaySettings, run_replay
from lbbench.routers import get_router


def _requests(n: int, rate: float, seed: int = 5) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return [Request(i, float(t[i]), int(rng.integers(8, 64)), int(rng.integers(2, 24))) for i in range(n)]


def test_every_request_recorded_once_at_the_asked_rate(fleet, tmp_path):
    reqs = _requests(240, 80.0)
    res = run_replay(reqs, get_router("jsq", num_instances=2), fleet.endpoints,
                     ReplaySettings(run_id="lw", seed=0, load_workers=2, scrape_interval_s=None, out_dir=tmp_path))
    assert res.complete and res.interrupted is None
    ids = [r.request_id for r in res.records]
    assert sorted(ids) == list(range(len(reqs)))  # each exactly once
    by_id = {r.request_id: r for r in res.records}
    for q in reqs:
        r = by_id[q.request_id]
        assert r.error is None and r.generated_tokens == q.output_tokens
        assert r.planned_send_s == pytest.approx(q.arrival_s, abs=1e-9)  # jsq never holds: sent on arrival
        assert r.dispatch_s >= r.arrival_s  # the decision took effect at the planned send, never before arrival
        assert r.actual_send_s <= r.first_token_s <= r.finish_s
    # every request was sent once, on the plan (the achieved rate is a timing target on a quiet host:
    # bench/bench_load_workers.py measures it, not this test)
    assert all(r.actual_send_s is not None for r in res.records)
    # both workers took part; each has an id, a clock offset within its error bound of zero (one machine, one
    # monotonic clock), and lag figures
    assert [w["worker"] for w in res.load_workers] == [0, 1]
    assert sum(w["requests"] for w in res.load_workers) == len(reqs)
    for w in res.load_workers:
        assert w["requests"] > 0 and w["lag_p99_ms"] is not None
        assert abs(w["clock_offset_ms"]) <= w["clock_error_ms"] + 1e-6
    cols = res.frame().select("load_worker", "clock_offset_s").collect()
    assert set(cols["load_worker"]) == {0, 1} and cols["clock_offset_s"].null_count() == 0
    rows = [json.loads(line) for line in (tmp_path / "requests.partial.jsonl").open()]
    assert len(rows) == len(reqs) and {r["load_worker"] for r in rows} == {0, 1}


def _kill_worker_after(partial, records: int, killed: list) -> threading.Thread:
    """Kill load worker 0 once ``records`` requests have finished (the run is under way)."""
    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if partial.is_file() and sum(1 for _ in partial.open()) >= records:
                for p in multiprocessing.active_children():
                    if p.name == "lbbench-load-0":
                        p.kill()
                        killed.append(p.pid)
                return
            time.sleep(0.05)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_a_worker_that_dies_stops_the_run_incomplete_with_what_finished(fleet, tmp_path):
    reqs = _requests(400, 40.0)  # 10 s of arrivals; worker 0 is killed after 40 have finished
    killed: list = []
    watcher = _kill_worker_after(tmp_path / "requests.partial.jsonl", 40, killed)
    res = run_replay(reqs, get_router("round_robin", num_instances=2), fleet.endpoints,
                     ReplaySettings(run_id="lw", seed=0, load_workers=2, scrape_interval_s=None, out_dir=tmp_path))
    watcher.join(5)
    assert killed, "the worker was not found to kill"
    assert not res.complete and res.interrupted.startswith("load worker 0 lost")
    ids = [r.request_id for r in res.records]
    assert 0 < len(ids) < len(reqs) and len(set(ids)) == len(ids)
    assert all(r.error is None for r in res.records)  # what finished is kept, as it was
    assert sum(1 for _ in (tmp_path / "requests.partial.jsonl").open()) == len(ids)


def test_auto_load_workers_from_the_rate_and_the_cores():
    assert auto_load_workers(20.0, 8) == 0  # one process keeps up
    assert auto_load_workers(80.0, 1) == 0  # a worker would share the only core
    assert auto_load_workers(80.0, 2) == 1
    assert auto_load_workers(2500.0, 16) == 3
    assert auto_load_workers(2500.0, 2) == 1  # the driver keeps a core
    assert auto_load_workers(None, 8) == 0


def test_load_workers_through_the_cli(fleet, run_on_fleet, tmp_path):
    res, df = run_on_fleet("--rate", "60", "--requests", "60", "--router", "round_robin", "--load-workers", "2")
    assert df.height == 60 and df["error"].null_count() == 60 and (df["generated_tokens"] == 8).all()
    assert set(df["load_worker"].to_list()) == {0, 1} and df["clock_offset_s"].null_count() == 0
    doc = tomllib.loads((tmp_path / "run.toml").read_text())
    assert doc["complete"] is True and doc["config"]["load_workers"] == 2
    assert [w["worker"] for w in doc["load_workers"]] == [0, 1]
    assert all("lag_p99_ms" in w and "clock_offset_ms" in w for w in doc["load_workers"])
    assert "load worker 0" in res.output  # the per-worker line
    for bad in (["--load-workers", "-1"], ["--load-workers", "two"], ["--load-workers", "2", "--stream-workers", "2"]):
        res = CliRunner().invoke(main, ["run", "--endpoint", fleet.endpoints[0], *bad])
        assert res.exit_code == 2 and "--load-workers" in res.output, res.output


def test_workers_remeasure_their_clock_offset_during_the_run(fleet, tmp_path, monkeypatch):
    import dataclasses

    import lbbench.harness.replay as replay
    real = replay.LoadWorkers

    def every_half_second(n, settings, **kw):
        return real(n, dataclasses.replace(settings, resync_every_s=0.5), **kw)
    monkeypatch.setattr(replay, "LoadWorkers", every_half_second)  # where the replay looks it up
    reqs = _requests(160, 40.0)  # 4 s of arrivals: several re-measurements per worker
    res = run_replay(reqs, get_router("round_robin", num_instances=2), fleet.endpoints,
                     ReplaySettings(run_id="lw", seed=0, load_workers=2, scrape_interval_s=None, out_dir=tmp_path))
    assert res.complete and sorted(r.request_id for r in res.records) == list(range(len(reqs)))
    assert all(r.error is None for r in res.records)
    for w in res.load_workers:
        assert w["clock_resyncs"] >= 3
        # one machine, one monotonic clock: no drift beyond the two measurements' error bounds
        assert abs(w["clock_drift_ms"]) <= 2 * max(w["clock_error_ms"], 1.0)
