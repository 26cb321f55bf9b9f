"""``lbbench proxy --admission --tenants``: over the queue limit a request gets 429; a higher band displaces a
held request of a lower one (503) and is served; an unknown tenant gets 400; the held queue never grows past its
limit and the metrics count every status; a burst beyond the queue is answered 429 at once, with exactly the limit
held. ``--signal-lag-s``: the router sees a finish only that much later."""

from __future__ import annotations

import asyncio
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

            async def counts() -> tuple[int, int]:
                return disp.admission.num_held, gw.gateway.state.view().instances[0].num_outstanding

            def watch():
                # read on the gateway's own loop, between its callbacks: an arrival is held and, when over the
                # limit, shed in one callback, so a read from another thread could catch max_queue + 1 in between
                while not stop.is_set():
                    held, out = gw.call(counts)
                    peak[0], peak[1] = max(peak[0], held), max(peak[1], out)
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


class _HeldBackend:
    """A backend that answers nothing until ``release()``: it counts the requests it has received, so a test can
    see what the gateway sent before any request finished."""

    def __init__(self) -> None:
        from aiohttp import web

        self.received = 0
        self._loop = asyncio.new_event_loop()
        self._go = asyncio.Event()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

        async def completions(request: web.Request) -> web.Response:
            self.received += 1
            await self._go.wait()
            return web.json_response({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}})

        async def health(request: web.Request) -> web.Response:
            return web.Response(status=200)

        async def start() -> int:
            app = web.Application()
            app.add_routes([web.post("/v1/completions", completions), web.get("/health", health)])
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            return site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{asyncio.run_coroutine_threadsafe(start(), self._loop).result(30)}"

    def release(self) -> None:
        self._loop.call_soon_threadsafe(self._go.set)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def test_a_burst_beyond_the_queue_is_answered_429_while_the_held_wait():
    """Counts only: with a backend that answers nothing, a burst of 3 + 5 + 12 requests leaves 3 at the backend
    (max_outstanding), 5 held (max_queue) and 12 answered 429 before any request finished; once the backend
    answers, the 8 others get 200."""
    backend = _HeldBackend()
    try:
        cfg = ProxyConfig(backends=[backend.url], router=get_router("round_robin", num_instances=1, seed=0),
                          health_interval_s=0.2, admission=AdmissionSpec(max_queue=5, max_outstanding=3))
        with GatewayThread(cfg) as gw:
            statuses: list[int] = []
            lock = threading.Lock()

            def post() -> None:
                status = _post(gw.url, None, 1)[0]
                with lock:
                    statuses.append(status)
            threads = [threading.Thread(target=post) for _ in range(20)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 60  # a hang guard, not a timing assertion
            while (len(statuses) < 12 or backend.received < 3) and time.monotonic() < deadline:
                time.sleep(0.01)
            adm = gw.gateway.dispatcher.admission
            assert sorted(statuses) == [429] * 12  # the rest are answered at once, while the backend holds all
            assert adm.num_held == 5 and backend.received == 3
            assert gw.gateway.state.view().instances[0].num_outstanding == 3
            assert adm.num_rejected == 12 and adm.num_evicted == 0
            backend.release()
            for t in threads:
                t.join(60)
            assert sorted(statuses) == [200] * 8 + [429] * 12
            assert backend.received == 8 and adm.num_held == 0
            metrics = urllib.request.urlopen(gw.url + "/metrics").read().decode()
            assert 'lbbench_proxy_requests_total{status="429"} 12' in metrics
            assert 'lbbench_proxy_requests_total{status="200"} 8' in metrics
    finally:
        backend.close()
