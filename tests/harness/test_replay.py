"""The HTTP path end to end: run_replay against emulated instances on free ports."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbbench.core import Request
from lbbench.profiles import load_profile
from lbbench.engines.vllm.emulator import free_port
from lbbench.rundir import PARTIAL_RECORDS
from lbbench.harness.replay import EndpointError, ReplaySettings, check_endpoints, normalize_endpoint, run_replay
from lbbench.routers import get_router


def _frame(result) -> pl.DataFrame:
    return pl.DataFrame([r.as_dict() for r in result.records])


def test_replay_at_80_rps_is_complete_exact_and_consistent(a100_fleet, tmp_path, make_requests):
    reqs = make_requests(200, 80.0, seed=1)
    router = get_router("jsq", num_instances=2, seed=0)
    seen = []
    res = run_replay(reqs, router, a100_fleet.endpoints,
                     ReplaySettings(run_id="t", seed=0, out_dir=tmp_path, scrape_interval_s=0.25,
                                    progress=lambda d, t: seen.append((d, t))))
    assert res.complete and res.interrupted is None
    df = _frame(res)
    assert df.height == 200 and df["request_id"].n_unique() == 200
    assert df["error"].null_count() == 200
    assert (df["generated_tokens"] == df["output_tokens"]).all()
    assert (df["server_output_tokens"] == df["output_tokens"]).all()
    assert (df["server_prompt_tokens"] == df["prompt_tokens"]).all()
    assert (df["http_status"] == 200).all()
    assert set(df["instance"].unique()) == {0, 1}
    # open loop on the absolute schedule: the achieved rate is the requested one
    span = df["actual_send_s"].max() - df["actual_send_s"].min()
    assert (len(reqs) - 1) / span == pytest.approx(
        (len(reqs) - 1) / (reqs[-1].arrival_s - reqs[0].arrival_s), rel=0.1)
    lag = df["actual_send_s"] - df["planned_send_s"]
    assert lag.min() >= 0 and lag.quantile(0.5) < 0.02
    # the run clock resolves below a millisecond (uvloop's loop clock moves in whole milliseconds)
    ms = (df["actual_send_s"] * 1000.0) % 1.0
    assert ((ms > 0.01) & (ms < 0.99)).sum() > 100
    # jsq never defers, so nothing was held by the router
    assert (df["planned_send_s"] == df["arrival_s"]).all()
    for rec in res.records:
        times = res.token_times[rec.request_id]
        assert len(times) == rec.output_tokens
        assert rec.first_token_s == times[0]
        assert rec.actual_send_s <= rec.first_token_s <= rec.finish_s
        assert rec.finish_s >= times[-1]
        assert rec.dispatch_s >= rec.arrival_s
        if rec.output_tokens > 1:
            gaps = np.diff(times)
            assert rec.tbt_mean_s == pytest.approx(gaps.mean())
            assert rec.tbt_max_s == pytest.approx(gaps.max())
    # the records were appended as the requests finished
    lines = (tmp_path / PARTIAL_RECORDS).read_text().splitlines()
    assert sorted(json.loads(x)["request_id"] for x in lines) == list(range(200))
    # metrics timeline from /metrics
    m = res.metrics
    assert m.columns == ["time_s", "instance", "num_running", "num_waiting", "kv_usage", "num_preemptions"]
    assert m.height >= 2 and set(m["instance"].unique()) == {0, 1}
    assert m["num_running"].max() > 0
    assert seen[-1] == (200, 200)


def test_emulated_timings_follow_the_profile(a100_fleet):
    """One request alone: TTFT is one prefill step, the gaps are decode steps."""
    req = Request(0, 0.0, prompt_tokens=1000, output_tokens=20)
    res = run_replay([req], get_router("round_robin", num_instances=2, seed=0), a100_fleet.endpoints,
                     ReplaySettings(run_id="t", seed=0, scrape_interval_s=None))
    rec = res.records[0]
    p = load_profile("llama3.1-8b-a100-v0")
    prefill_s = p.base_s + p.prefill_token_s * 1000
    # never early; late only by the client's and the emulator's scheduling noise
    assert prefill_s - 0.005 <= rec.first_token_s - rec.actual_send_s <= prefill_s + 0.06
    assert rec.tbt_mean_s == pytest.approx(p.base_s + p.decode_seq_s + p.context_token_s * 1010, rel=0.3)


def test_chat_api_and_text_prompts(a100_fleet):
    reqs = [Request(i, 0.01 * i, prompt_tokens=12, output_tokens=5, prompt="route this request " * 3)
            for i in range(4)]
    for api in ("chat", "completions"):
        res = run_replay(reqs, get_router("round_robin", num_instances=2, seed=0), a100_fleet.endpoints,
                         ReplaySettings(run_id="t", seed=0, api=api, scrape_interval_s=None))
        assert res.complete
        assert all(r.error is None and r.generated_tokens == 5 for r in res.records)


def test_killed_instance_fails_its_in_flight_requests_and_the_run_goes_on(tmp_path, make_requests):
    from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
    from lbbench.profiles import load_profile

    reqs = make_requests(240, 80.0, seed=2, output=(60, 120))
    with EmulatorFleet(FleetConfig(load_profile("llama3.1-8b-a100-v0"), 2)) as fleet:
        killed_at = []

        def kill():
            killed_at.append(time.monotonic())
            fleet.kill(1)

        timer = threading.Timer(1.5, kill)
        timer.start()
        try:
            res = run_replay(reqs, get_router("round_robin", num_instances=2, seed=0), fleet.endpoints,
                             ReplaySettings(run_id="t", seed=0, out_dir=tmp_path, scrape_interval_s=0.5))
        finally:
            timer.cancel()
    assert res.complete, "the run must complete despite the crash"
    df = _frame(res)
    assert df.height == 240 and df["request_id"].n_unique() == 240
    kill_s = killed_at[0] - res.clock_origin_s
    failed = df.filter(pl.col("error").is_not_null())
    ok = df.filter(pl.col("error").is_null())
    assert failed.height >= 1
    # only the killed instance's requests failed, with a connection error
    assert (failed["instance"] == 1).all()
    assert failed["error"].str.contains("connection").all()
    # the ones in flight at the crash were sent before it
    in_flight = failed.filter(pl.col("actual_send_s") < kill_s)
    assert in_flight.height >= 1
    # the router stopped sending to it soon after
    late = df.filter(pl.col("dispatch_s") > kill_s + 0.3)
    assert late.height > 50 and (late["instance"] == 0).all()
    # nothing else lost: every other request finished with its exact length
    assert (ok["generated_tokens"] == ok["output_tokens"]).all()
    assert ok.height + failed.height == 240


def test_unreachable_endpoint_is_a_clear_error():
    port = free_port()
    with pytest.raises(EndpointError, match=rf"^endpoint http://127.0.0.1:{port}: unreachable"):
        check_endpoints([f"http://127.0.0.1:{port}"])
    with pytest.raises(EndpointError, match="unreachable"):
        run_replay([Request(0, 0.0, 4, 4)], get_router("round_robin", num_instances=1, seed=0), [f"127.0.0.1:{port}"],
                   ReplaySettings(run_id="t", seed=0))


def test_endpoint_normalization(a100_fleet):
    url = a100_fleet.endpoints[0]
    assert normalize_endpoint(url + "/v1/") == url
    assert normalize_endpoint(url.removeprefix("http://")) == url
    assert check_endpoints([url + "/v1"]) == [url]


class _BadRouter:
    """Sends everything to an instance that does not exist."""

    name = "bad"

    def route(self, queue, view, now_s):
        return (0, view.num_instances)


class _HoldFirstRouter:
    """Defers until 0.3 s, then dispatches the head of the queue to instance 0."""

    name = "hold"

    def route(self, queue, view, now_s):
        return None if now_s < 0.3 else (0, 0)


def test_router_error_ends_the_run_with_that_error(a100_fleet, tmp_path):
    from lbbench.dispatch import RouterError

    with pytest.raises(RouterError, match="invalid decision"):
        run_replay([Request(0, 0.0, 8, 4), Request(1, 0.05, 8, 4)], _BadRouter(), a100_fleet.endpoints,
                   ReplaySettings(run_id="t", seed=0, out_dir=tmp_path))


def test_deferral_epochs_and_planned_send_time(a100_fleet):
    reqs = [Request(i, 0.01 * i, 8, 4) for i in range(5)]
    res = run_replay(reqs, _HoldFirstRouter(), a100_fleet.endpoints,
                     ReplaySettings(run_id="t", seed=0, min_step_s=0.02, scrape_interval_s=None))
    assert res.complete
    for rec in res.records:
        assert rec.error is None and rec.instance == 0
        # held by the router until the first epoch after 0.3 s (epochs every 20 ms)
        assert 0.3 <= rec.dispatch_s < 0.5
        # the hold is the router's, not the client's: planned send moves with it
        # (planned = arrival + hold; it trails dispatch_s by the arrival's own lateness)
        assert rec.dispatch_s - 0.02 <= rec.planned_send_s <= rec.dispatch_s
        assert rec.actual_send_s - rec.planned_send_s < 0.05


def test_requests_fail_cleanly_when_every_instance_is_down():
    from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
    from lbbench.profiles import load_profile

    reqs = [Request(i, 0.05 * i, 16, 200) for i in range(30)]  # 1.5 s of arrivals, long outputs
    with EmulatorFleet(FleetConfig(load_profile("llama3.1-8b-a100-v0"), 1)) as fleet:
        timer = threading.Timer(0.5, fleet.kill, args=(0,))
        timer.start()
        try:
            res = run_replay(reqs, get_router("round_robin", num_instances=1, seed=0), fleet.endpoints,
                             ReplaySettings(run_id="t", seed=0, stall_timeout_s=0.5, health_interval_s=0.1,
                                            scrape_interval_s=None))
        finally:
            timer.cancel()
    assert res.complete and len(res.records) == 30
    errors = [r.error for r in res.records]
    assert all(e is not None for e in errors)  # nothing could finish 200 tokens in 0.5 s
    assert any(e.startswith("connection error") for e in errors)
    never = [r for r in res.records if r.error.startswith("not dispatched: no healthy instance")]
    assert never and all(r.instance == -1 and r.actual_send_s is None for r in never)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.floats(0.0, 0.3), st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=25),
       st.sampled_from(["round_robin", "jsq", "random"]))
def test_every_request_ends_exactly_once_with_consistent_times(zero_fleet, rows, router_name):
    reqs = [Request(i, t, p, o) for i, (t, p, o) in enumerate(rows)]  # bursts: equal times allowed
    res = run_replay(reqs, get_router(router_name, num_instances=2, seed=0), zero_fleet.endpoints,
                     ReplaySettings(run_id="p", seed=0, scrape_interval_s=None, warm_connections=2))
    assert res.complete
    assert sorted(r.request_id for r in res.records) == list(range(len(reqs)))
    by_id = {r.request_id: r for r in reqs}
    for rec in res.records:
        req = by_id[rec.request_id]
        assert rec.error is None and rec.generated_tokens == req.output_tokens
        assert rec.arrival_s <= rec.dispatch_s <= rec.actual_send_s <= rec.first_token_s <= rec.finish_s
        assert rec.planned_send_s == rec.arrival_s
        assert 0 <= rec.instance < 2
