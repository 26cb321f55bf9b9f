"""Stream handling in worker processes: the same records as one process, through the library and the CLI."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.core import Request
from lbbench.harness.replay import ReplaySettings, run_replay
from lbbench.live.workers import StreamWorkers, WorkerSettings
from lbbench.routers import get_router


def _requests(n: int = 60, rate: float = 100.0) -> list[Request]:
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return [Request(i, float(t[i]), int(rng.integers(8, 64)), int(rng.integers(2, 24))) for i in range(n)]


def test_stream_workers_give_the_records_one_process_gives(fleet, tmp_path):
    reqs = _requests()
    runs = {}
    for workers in (0, 2):
        res = run_replay(reqs, get_router("round_robin", num_instances=2), fleet.endpoints,
                         ReplaySettings(run_id="w", seed=0, stream_workers=workers, scrape_interval_s=None,
                                        out_dir=tmp_path / str(workers)))
        assert res.complete and len(res.records) == len(reqs)
        runs[workers] = {r.request_id: r for r in res.records}
    for rid, one in runs[0].items():
        two = runs[2][rid]
        assert two.error is None and two.instance == one.instance  # round robin: same instance per request
        assert two.generated_tokens == one.generated_tokens == reqs[rid].output_tokens
        assert two.planned_send_s == pytest.approx(one.planned_send_s, abs=0.05)
        assert two.actual_send_s >= two.planned_send_s - 1e-3
        assert two.actual_send_s <= two.first_token_s <= two.finish_s
    # every record reached the partial file as it completed
    assert sum(1 for _ in (tmp_path / "2" / "requests.partial.jsonl").open()) == len(reqs)


def test_a_worker_that_dies_is_reported_to_the_dispatcher(fleet):
    settings = WorkerSettings(endpoints=tuple(fleet.endpoints), model="tiny", api="completions", engine="vllm",
                              request_timeout_s=10.0, min_step_s=0.02, warm_connections=1)
    workers = StreamWorkers(1, settings)
    errors: list[BaseException] = []
    loop = asyncio.new_event_loop()
    try:
        workers.start(loop, 0.0, lambda item: None, errors.append)
        workers.procs[0].kill()
        loop.run_until_complete(asyncio.sleep(0.5))
    finally:
        workers.close()
        loop.close()
    assert errors and "stream worker 0 exited" in str(errors[0])


def test_stream_workers_through_the_cli(run_on_fleet):
    _, df = run_on_fleet("--rate", "50", "--requests", "40", "--router", "round_robin,least_requests",
                         "--stream-workers", "2")
    assert df.height == 80 and df["error"].null_count() == 80
    assert (df["generated_tokens"] == 8).all()
    res = CliRunner().invoke(main, ["run", "--stream-workers", "-1"])
    assert res.exit_code == 2
