"""``lbbench proxy --admission --tenants``: over the queue limit a request gets 429; a higher band displaces a
held request of a lower one (503) and is served; an unknown tenant gets 400; the held queue never grows past its
limit and the metrics count every status. ``--signal-lag-s``: the router sees a finish only that much later."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from lbbench.admission import AdmissionSpec, Tenant
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
from lbbench.profiles import load_profile
from lbbench.proxy.gateway import TENANT_HEADER, GatewayThread, ProxyConfig
from lbbench.routers import get_router

PROFILE = load_profile("llama3.1-8b-a100")


def _post(url: str, tenant: str | None, max_tokens: int) -> tuple[int, bytes]:
    body = json.dumps({"model": PROFILE.model, "prompt": "x", "max_tokens": max_tokens}).encode()
    headers = {"Content-Type": "application/json", **({TENANT_HEADER: tenant} if tenant else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", data=body,
                                                           headers=headers)) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def gateway():
    with EmulatorFleet(FleetConfig(PROFILE, 1)) as fleet:
        cfg = ProxyConfig(backends=list(fleet.endpoints), router=get_router("round_robin", num_instances=1, seed=0),
                          health_interval_s=0.2, admission=AdmissionSpec(max_queue=1, max_outstanding=1),
                          tenants=[Tenant("gold", 1), Tenant("std", 0)])
        with GatewayThread(cfg) as gw:
            yield gw


def test_shedding_and_displacement_through_the_proxy(gateway):
    url = gateway.url
    results: dict[str, tuple[int, bytes]] = {}
    peak = [0]

    def send(name: str, tenant: str, max_tokens: int) -> threading.Thread:
        t = threading.Thread(target=lambda: results.__setitem__(name, _post(url, tenant, max_tokens)))
        t.start()
        return t

    def held() -> int:
        n = gateway.gateway.dispatcher.admission.num_held
        peak[0] = max(peak[0], n)
        return n

    def wait_until(cond, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.005)

    busy = send("busy", "std", 400)  # occupies the one slot for a while
    wait_until(lambda: gateway.gateway.state.view().instances[0].num_outstanding == 1)
    waiting = send("waiting", "std", 2)
    wait_until(lambda: held() == 1)
    assert _post(url, "std", 2)[0] == 429  # the queue is full and this one is in the lowest band itself
    gold = send("gold", "gold", 2)  # displaces the held std request
    for t in (busy, waiting, gold):
        t.join(60)
        held()
    assert results["busy"][0] == 200 and results["gold"][0] == 200
    status, body = results["waiting"]
    assert status == 503 and b"displaced" in body
    assert peak[0] <= 1
    status, body = _post(url, "nobody", 2)
    assert status == 400 and b"unknown tenant 'nobody'" in body
    metrics = urllib.request.urlopen(url + "/metrics").read().decode()
    for code, n in (("429", 1), ("503", 1), ("400", 1)):
        assert f'lbbench_proxy_requests_total{{status="{code}"}} {n}' in metrics, metrics


def test_the_router_sees_a_finish_only_after_the_signal_lag():
    with EmulatorFleet(FleetConfig(PROFILE, 1)) as fleet:
        cfg = ProxyConfig(backends=list(fleet.endpoints), router=get_router("round_robin", num_instances=1, seed=0),
                          health_interval_s=0.2, signal_lag_s=30.0)
        with GatewayThread(cfg) as gw:
            assert _post(gw.url, None, 2)[0] == 200
            disp = gw.gateway.dispatcher
            now = gw.gateway.now()
            assert disp.state.view().instances[0].num_outstanding == 0  # the gateway's own count is current
            assert disp.view(now).instances[0].num_outstanding == 1  # the router's is 30 s late
            assert disp.view(now + 31.0).instances[0].num_outstanding == 0


def test_under_overload_every_request_is_answered_and_the_queue_stays_bounded():
    from concurrent.futures import ThreadPoolExecutor

    with EmulatorFleet(FleetConfig(PROFILE, 1)) as fleet:
        cfg = ProxyConfig(backends=list(fleet.endpoints), router=get_router("round_robin", num_instances=1, seed=0),
                          health_interval_s=0.2, admission=AdmissionSpec(max_queue=8, max_outstanding=4))
        with GatewayThread(cfg) as gw:
            disp = gw.gateway.dispatcher
            peak = [0, 0]
            stop = threading.Event()

            def watch():
                while not stop.is_set():
                    peak[0] = max(peak[0], disp.admission.num_held)
                    peak[1] = max(peak[1], gw.gateway.state.view().instances[0].num_outstanding)
                    time.sleep(0.002)
            watcher = threading.Thread(target=watch)
            watcher.start()
            with ThreadPoolExecutor(48) as pool:
                statuses = list(pool.map(lambda _: _post(gw.url, None, 40)[0], range(240)))
            stop.set()
            watcher.join()
            assert len(statuses) == 240 and set(statuses) <= {200, 429}  # every request answered
            assert statuses.count(200) >= 12 and statuses.count(429) >= 100
            assert peak[0] <= 8 and peak[1] <= 4
            assert disp.admission.num_held == 0 and disp.waiting == 0
            assert disp.admission.num_rejected == statuses.count(429)
