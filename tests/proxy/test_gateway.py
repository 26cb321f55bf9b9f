"""lbbench proxy: a stock OpenAI client through the gateway (streaming and not, completions and chat), lbbench's
own replay through it, routing spread, failover when a backend dies, limits, auth, metrics and draining."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from harness.conftest import poisson_requests
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
from lbbench.harness.replay import ReplaySettings, run_replay
from lbbench.profiles import load_profile
from lbbench.proxy.gateway import GatewayThread, ProxyConfig, prompt_tokens_of
from lbbench.routers import get_router
from lbbench.routers.heuristics import RoundRobin

openai = pytest.importorskip("openai")
PROFILE = load_profile("llama3.1-8b-a100-v0")


@pytest.fixture
def fleet():
    with EmulatorFleet(FleetConfig(PROFILE, 2, allow_kill=True)) as f:
        yield f


def _gateway(fleet, router="round_robin", **kw):
    """A gateway over ``fleet`` routing with ``router`` (a name, or a router object)."""
    if isinstance(router, str):
        router = get_router(router, num_instances=2, seed=0)
    cfg = ProxyConfig(backends=list(fleet.endpoints), router=router, health_interval_s=0.2, **kw)
    return GatewayThread(cfg)


def test_prompt_length_estimates():
    assert prompt_tokens_of({"prompt": [1, 2, 3]}) == (3, None)
    assert prompt_tokens_of({"prompt": "abcd" * 10}) == (10, "abcd" * 10)
    n, text = prompt_tokens_of({"messages": [{"role": "user", "content": "x" * 40}]})
    assert n == 10 and text == "x" * 40


class _LoggedRoundRobin(RoundRobin):
    """Round robin that logs each pick with the instances it saw as healthy, so that the test can tell a routing
    fault from a backend the proxy had (rightly) marked down or retried away from on a loaded host."""

    def __init__(self):
        super().__init__(num_instances=2, seed=0)
        self.log: list[tuple[int | None, tuple[int, ...]]] = []

    def pick(self, request, view):
        i = super().pick(request, view)
        self.log.append((i, tuple(view.healthy_indices())))
        return i


def test_stock_openai_client_streaming_and_not(fleet):
    router = _LoggedRoundRobin()
    with _gateway(fleet, router) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="none")
        model = client.models.list().data[0].id
        assert model == PROFILE.model
        c = client.completions.create(model=model, prompt="route me", max_tokens=7)
        assert c.usage.completion_tokens == 7
        chunks = list(client.completions.create(model=model, prompt="route me", max_tokens=9, stream=True,
                                                stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens == 9  # a chunk may carry several tokens when the server catches up
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices).count(" t") == 9
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=5)
        assert chat.usage.completion_tokens == 5
        stream = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=6, stream=True, stream_options={"include_usage": True}))
        assert stream[-1].usage.completion_tokens == 6
        served = [inst.num_finished_total for inst in fleet.instances]
        metrics = _metrics_with(gw.url, 'lbbench_proxy_requests_total{status="200"} 4')
        assert len(router.log) >= 4, router.log  # one pick per request, more only for retries
        # every pick is round robin's next healthy instance after the previous pick
        last = None
        for i, healthy in router.log:
            assert i in healthy, (router.log, metrics)
            if last is not None and len(healthy) == 2:
                assert i != last, (router.log, metrics)
            last = i
        if len(router.log) == 4 and all(len(h) == 2 for _, h in router.log):  # no retry, both healthy throughout
            assert served == [2, 2], (served, router.log, metrics)  # round robin alternated
        else:  # the proxy retried or marked a backend down (the picks above were still round robin's): all served
            assert sum(served) == 4, (served, router.log, metrics)
        assert 'lbbench_proxy_requests_total{status="200"} 4' in metrics
        assert "lbbench_proxy_request_duration_seconds_count 4" in metrics
        assert "lbbench_proxy_router_decisions_total" in metrics


def _metrics_with(url: str, line: str, timeout_s: float = 2.0) -> str:
    """The /metrics page once it contains ``line`` (the last stream's bookkeeping may trail its last byte)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = urllib.request.urlopen(url + "/metrics").read().decode()
        if line in text or time.monotonic() > deadline:
            return text
        time.sleep(0.02)


def test_lbbench_replay_through_the_proxy(fleet):
    reqs = poisson_requests(60, 40.0)
    with _gateway(fleet, router="least_requests") as gw:
        res = run_replay(reqs, get_router("round_robin", num_instances=1, seed=0), [gw.url],
                         ReplaySettings(run_id="p", seed=0, scrape_interval_s=None))
    assert res.complete and all(r.error is None for r in res.records)
    assert all(r.generated_tokens == r.output_tokens for r in res.records)
    assert min(inst.num_finished_total for inst in fleet.instances) > 10  # both backends served


def test_a_dead_backend_costs_no_client_errors(fleet):
    with _gateway(fleet) as gw:
        fleet.kill(1)
        reqs = poisson_requests(30, 30.0)
        res = run_replay(reqs, get_router("round_robin", num_instances=1, seed=0), [gw.url],
                         ReplaySettings(run_id="k", seed=0, scrape_interval_s=None))
        assert all(r.error is None for r in res.records), [r.error for r in res.records if r.error]
        metrics = urllib.request.urlopen(gw.url + "/metrics").read().decode()
        assert f'lbbench_proxy_backend_healthy{{backend="{fleet.endpoints[1]}"}} 0' in metrics


def _post(url, body: bytes, headers=None):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_auth_limits_bad_json_and_drain(fleet):
    body = json.dumps({"model": PROFILE.model, "prompt": "x", "max_tokens": 2}).encode()
    with _gateway(fleet, api_key="k", max_body_bytes=1024) as gw:
        assert _post(gw.url + "/v1/completions", body)[0] == 401
        ok = {"Authorization": "Bearer k"}
        assert _post(gw.url + "/v1/completions", body, ok)[0] == 200
        assert _post(gw.url + "/v1/completions", b"{" + b" " * 4096 + b"}", ok)[0] == 413
        assert _post(gw.url + "/v1/completions", b"[1, 2]", ok)[0] == 400
        gw.call(gw.gateway.drain, 1.0)
        assert _post(gw.url + "/v1/completions", body, ok)[0] == 503
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(gw.url + "/health")
