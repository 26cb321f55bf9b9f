"""The priority path live: the client sends each request's ``priority`` field, an
emulated server (``lbbench serve-sim --instance-scheduler priority``) serves by it,
and the launcher asks vLLM for ``--scheduling-policy priority``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import replace

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
from lbbench.live.http import request_body
from lbbench.engines.vllm.launcher import server_args
from lbbench.harness.replay import ReplaySettings, run_replay
from lbbench.routers import get_router
from lbbench.priority import request_priority
from factories import req, tiny_profile


def _post(url: str, body: dict) -> int:
    r = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_body_carries_the_priority_only_when_asked():
    r = req(0, 0.0, 10, 4)
    assert "priority" not in request_body(r, "m")
    assert request_body(r, "m", priority=37)["priority"] == 37
    args = server_args("m", "m", 8000, chunked_prefill=None, max_num_seqs=None, max_num_batched_tokens=None,
                       cpu=False, scheduling_policy="priority")
    assert args[args.index("--scheduling-policy") + 1] == "priority"
    assert "--scheduling-policy" not in server_args("m", "m", 8000, chunked_prefill=None, max_num_seqs=None,
                                                    max_num_batched_tokens=None, cpu=False)


def test_emulated_fcfs_server_rejects_a_priority_as_vllm_does():
    with EmulatorFleet(FleetConfig(tiny_profile(), 1)) as fleet:
        url = fleet.endpoints[0] + "/v1/completions"
        assert _post(url, {"prompt": [1] * 8, "max_tokens": 2, "priority": 3}) == 400
        assert _post(url, {"prompt": [1] * 8, "max_tokens": 2, "priority": 0}) == 200
    with EmulatorFleet(FleetConfig(tiny_profile(), 1, scheduler="priority")) as fleet:
        url = fleet.endpoints[0] + "/v1/completions"
        assert _post(url, {"prompt": [1] * 8, "max_tokens": 2, "priority": 3}) == 200
        assert _post(url, {"prompt": [1] * 8, "max_tokens": 2, "priority": "high"}) == 400


@pytest.mark.parametrize("senders", [{}, {"stream_workers": 1}, {"load_workers": 1}],
                         ids=["in-process", "stream-worker", "load-worker"])
def test_live_priority_order_through_an_emulated_server(senders):
    # one sequence slot: request 0 runs, the others queue at the server; their predicted
    # lengths (not their true ones, all equal) decide the order under the priority policy
    prof = tiny_profile(max_num_seqs=1, base_s=0.02)
    predicted = {1: 40, 2: 5, 3: 20, 4: 10}
    # 5 ms apart, all inside request 0's ~0.14 s of service, with a warm connection each: the arrival order at the
    # server is the send order even when the host delays one send by a few milliseconds
    reqs = [req(0, 0.0, 8, 6)] + [replace(req(i, 0.01 + 0.005 * i, 8, 6), predicted_output_tokens=p)
                                  for i, p in predicted.items()]
    order = {}
    for sched in ("fcfs", "priority"):
        with EmulatorFleet(FleetConfig(prof, 1, scheduler=sched)) as fleet:
            prio = (lambda r, i: request_priority(r, prof)) if sched == "priority" else None
            res = run_replay(reqs, get_router("round_robin", num_instances=1), fleet.endpoints,
                             ReplaySettings(run_id="t", seed=0, scrape_interval_s=None, min_step_s=prof.min_step_s,
                                            priority_of=prio, warm_connections=len(reqs), **senders))
        assert res.complete and all(r.error is None for r in res.records)
        order[sched] = [r.request_id for r in sorted(res.records, key=lambda r: r.first_token_s)]
    assert order["fcfs"] == [0, 1, 2, 3, 4]
    assert order["priority"] == [0, 2, 4, 3, 1]


def test_run_against_serve_sim_with_the_priority_scheduler(tmp_path):
    prof_name = "llama3.1-8b-a100-v0"
    from lbbench.profiles import load_profile

    with EmulatorFleet(FleetConfig(load_profile(prof_name), 2, scheduler="priority")) as fleet:
        args = ["run", "--profile", prof_name, "--router", "round_robin", "--instance-scheduler", "priority",
                "--predictor", "noisy:0.79", "--rate", "20", "--requests", "30", "--slo", "e2e=30",
                "--out", str(tmp_path / "live"), "--format", "json"]
        for url in fleet.endpoints:
            args += ["--endpoint", url]
        res = CliRunner().invoke(main, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert row["completed"] == 30 and row["failed"] == 0  # an fcfs server would have refused them
    assert 0 < row["slo_attainment"] <= 1 and row["goodput_per_s"] > 0
    df = pl.read_parquet(tmp_path / "live" / "requests.parquet")
    assert set(df["instance_scheduler"].unique()) == {"priority"}
