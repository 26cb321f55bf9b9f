"""``lbbench proxy``: an OpenAI-compatible gateway that routes other clients' traffic with lbbench's routers.

Every request that reaches ``/v1/completions`` or ``/v1/chat/completions`` becomes a ``Request`` in the same
``Dispatcher`` (central queue, decision epochs, deferral) and ``ClusterState`` the simulator uses, driven by the
live decision loop the replay harness uses too (``lbbench.live.drive.Drive``); the router picks the backend, and the body is forwarded unchanged, streamed back chunk by chunk (or
whole, for ``stream: false``). Lifecycle events — dispatched, first token, tokens so far, finished or failed —
feed the cluster state exactly as in a replay, so a policy chosen or trained with lbbench routes a real fleet
the same way.

- **Health.** Each backend's ``/health`` is probed every ``health_interval_s``; a backend that refuses a
  connection is marked down at once, one that leaves ``SLOW_PROBES_DOWN`` probes in a row unanswered too, and it
  comes back when its probe answers.
- **Retries.** A request whose backend failed before the first byte reached the client is routed again (at
  most ``max_retries`` times); one that already streamed is not (the client has part of an answer).
- **Limits.** Bodies over ``max_body_bytes`` are refused with 413; ``api_key`` requires
  ``Authorization: Bearer KEY``.
- **Flow control.** With ``admission`` (``lbbench.admission``) requests wait at the gateway while the backends
  are full and are released by priority band and tenant; over ``max_queue`` one is shed: 429 to a request refused
  on arrival, 503 to one displaced from the queue. The tenant is the ``x-llm-d-inference-fairness-id`` header
  (llm-d's); with ``tenants`` given, its band is the tenant's and an unknown tenant is refused with 400. The queue
  is bounded, so the gateway's memory is bounded under overload.
- **Prefill/decode.** Backends with roles (``ProxyConfig.specs``) and a pair router: a disaggregated request goes
  to its decode backend with its prefill backend in the ``x-prefiller-host-port`` header (llm-d's P/D sidecar
  protocol, ``lbbench.engines.vllm.pd``); the decode backend's timing headers are passed on to the client.
- **Drain.** ``drain()`` (SIGTERM in the CLI) refuses new requests with 503 and waits for those in flight.
- **Metrics.** ``/metrics`` in Prometheus text: requests by status, latency and TTFT histograms, per-backend
  in-flight and health, router decisions and deferrals, queue depth.

Prompt lengths: a token-id prompt is counted exactly; text is estimated at 4 bytes per token (the gateway has
no tokenizer). The output length the router sees is the request's ``max_tokens`` (the ``oracle`` predictor), or
what ``predictor`` predicts from the text.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

import aiohttp
from aiohttp import web

from ..admission import AdmissionSpec, Tenant, shed_message
from ..core import Failed, Finished, InstanceSpec, Request
from ..engines.vllm.pd import PREFILLER_HEADER, TIMING_HEADERS, host_port
from ..live.drive import Drive, probe_health
from ..live.memtrace import MemTrace
from ..predict import annotate
from .metrics import ProxyMetrics

DEFAULT_MAX_TOKENS = 256


@dataclass
class ProxyConfig:
    backends: list[str]
    router: Any
    specs: Sequence[InstanceSpec] | None = None
    predictor: Any = None
    api_key: str | None = None
    max_body_bytes: int = 8 << 20
    max_retries: int = 2
    health_interval_s: float = 1.0
    min_step_s: float = 0.02
    request_timeout_s: float = 600.0
    backend_names: list[str] = field(default_factory=list)
    admission: AdmissionSpec | None = None
    #: known tenants and their priority bands (None: any fairness id, band 0)
    tenants: Sequence[Tenant] | None = None
    #: the router sees what the backends report this much later (``Dispatcher``; 0: at once)
    signal_lag_s: float = 0.0
    #: each backend's KV-event publisher (ZMQ address, in ``backends``' order), read into the index of a router
    #: that reads KV events (``precise_prefix``; ``lbbench.live.kv_events``); empty: none
    kv_events: Sequence[str] = ()


#: the request header naming the tenant (llm-d's fairness id)
TENANT_HEADER = "x-llm-d-inference-fairness-id"


class _Shed(Exception):
    """Flow control shed the request: answer with ``status``."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def prompt_tokens_of(body: dict) -> tuple[int, str | None]:
    """(prompt tokens, prompt text) of an OpenAI request body."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt), None
    if isinstance(prompt, list):  # a batch of prompts: the first one stands for the request
        prompt = prompt[0] if prompt else ""
    if isinstance(prompt, str):
        return max(1, len(prompt.encode()) // 4), prompt
    msgs = body.get("messages")
    if isinstance(msgs, list):
        parts = []
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                parts.append(c)
            elif isinstance(c, list):
                parts += [p.get("text", "") for p in c if isinstance(p, dict)]
        text = "\n".join(parts)
        return max(1, len(text.encode()) // 4), text
    return 1, None


class Gateway:
    def __init__(self, cfg: ProxyConfig):
        self.cfg = cfg
        n = len(cfg.backends)
        self.drive = Drive(cfg.router, list(cfg.specs) if cfg.specs else [InstanceSpec(min_step_s=cfg.min_step_s)] * n,
                           min_step_s=cfg.min_step_s, on_dispatch=self._dispatched, admission=cfg.admission,
                           on_shed=self._shed, signal_lag_s=cfg.signal_lag_s)
        self._bands = {t.name: t.priority for t in cfg.tenants} if cfg.tenants else None
        self.state = self.drive.state
        self.dispatcher = self.drive.dispatcher
        self.metrics = ProxyMetrics(cfg.backend_names or cfg.backends)
        self._waiting: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.session: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task | None = None
        self._mem = MemTrace("proxy")  # LBBENCH_TRACEMALLOC: where a long run's memory goes
        self.kv_feed = None  # KVEventFeed (``cfg.kv_events``), started with the app
        self._prompt_ids: dict[int, list[int]] = {}  # request id -> its token-id prompt, while it is routed

    # -- clock and app ------------------------------------------------------------------
    def now(self) -> float:
        return self.drive.now()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.max_body_bytes)
        app.add_routes([
            web.post("/v1/completions", self._proxy), web.post("/v1/chat/completions", self._proxy),
            web.get("/v1/models", self._models), web.get("/health", self._health),
            web.get("/metrics", self._metrics),
        ])
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        self._mem.start()
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout_s))
        self._health_task = asyncio.create_task(self._watch_health())
        if self.cfg.kv_events and getattr(self.cfg.router, "bind_kv_events", None) is not None:
            from ..live.kv_events import KVEventFeed  # lazy: the live extra
            self.kv_feed = KVEventFeed(self.cfg.kv_events, self.now, lambda r: self._prompt_ids.get(r.request_id))
            self.kv_feed.bind(self.cfg.router)
            self.kv_feed.start()

    async def _stop(self, app: web.Application) -> None:
        self.drive.close()
        if self.kv_feed is not None:
            await self.kv_feed.close()
        if self._health_task is not None:
            self._health_task.cancel()
        if self.session is not None:
            await self.session.close()
        self._mem.dump()

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Refuse new requests; wait (up to ``timeout_s``) until those in flight are done."""
        self._draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    # -- routing ----------------------------------------------------------------------------
    def _epoch(self) -> None:
        before = self.dispatcher.num_decisions
        deferred = self.dispatcher.num_deferrals
        self.drive.epoch()
        self.metrics.decisions += self.dispatcher.num_decisions - before
        self.metrics.deferrals += self.dispatcher.num_deferrals - deferred

    def _dispatched(self, req: Request, inst: int, now: float) -> None:
        fut = self._waiting.pop(req.request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(inst)

    def _shed(self, req: Request, status: int) -> None:
        fut = self._waiting.pop(req.request_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(_Shed(status))

    async def _route(self, req: Request) -> int:
        fut = asyncio.get_running_loop().create_future()
        self._waiting[req.request_id] = fut
        self.drive.arrive(req)
        self._epoch()
        try:
            return await fut
        except asyncio.CancelledError:  # the client went away while the request was queued
            self._waiting.pop(req.request_id, None)
            self.drive.withdraw(req.request_id)
            raise
        finally:
            self._prompt_ids.pop(req.request_id, None)

    def _new_request(self, body: dict, tenant: str | None = None) -> Request:
        self._next_id += 1
        prompt_tokens, text = prompt_tokens_of(body)
        out = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
        band = self._bands.get(tenant, 0) if self._bands is not None and tenant is not None else 0
        req = Request(request_id=self._next_id, arrival_s=self.now(), prompt_tokens=prompt_tokens,
                      output_tokens=int(out), prompt=text, tenant=tenant, priority_band=band)
        if self.cfg.predictor is not None:
            req = annotate([req], self.cfg.predictor)[0]
        if self.kv_feed is not None and text is None and isinstance(body.get("prompt"), list):
            self._prompt_ids[req.request_id] = body["prompt"]  # the router keys its blocks (precise_prefix)
        return req

    # -- handlers -----------------------------------------------------------------------------
    def _unauthorized(self, request: web.Request) -> bool:
        key = self.cfg.api_key
        return key is not None and request.headers.get("Authorization") != f"Bearer {key}"

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        if self._unauthorized(request):
            return web.json_response({"error": {"message": "invalid API key", "type": "auth"}}, status=401)
        if self._draining:
            return web.json_response({"error": {"message": "the gateway is draining"}}, status=503)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.metrics.count("413")
            return web.json_response({"error": {"message": f"request body over {self.cfg.max_body_bytes} bytes"}},
                                     status=413)
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            self.metrics.count("400")
            return web.json_response({"error": {"message": f"request body is not a JSON object: {exc}"}},
                                     status=400)
        tenant = request.headers.get(TENANT_HEADER)
        if self._bands is not None and tenant not in self._bands:
            self.metrics.count("400")
            known = ", ".join(self._bands)
            return web.json_response({"error": {"message": f"unknown tenant {tenant!r} in {TENANT_HEADER} "
                                                           f"(known: {known})"}}, status=400)
        self._in_flight += 1
        self._idle.clear()
        t0 = self.now()
        try:
            return await self._forward(request, raw, bool(body.get("stream")), body, t0, tenant)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def _forward(self, request: web.Request, raw: bytes, stream: bool, body: dict,
                       t0: float, tenant: str | None = None) -> web.StreamResponse:
        last_error = "no backend answered"
        for _attempt in range(self.cfg.max_retries + 1):
            if not self.state.view().healthy_indices():
                break
            req = self._new_request(body, tenant)
            try:
                inst = await self._route(req)
            except _Shed as shed:
                self.metrics.count(str(shed.status))
                return web.json_response({"error": {"message": shed_message(shed.status),
                                                    "type": "overloaded"}}, status=shed.status)
            prefill = None
            decode = self.dispatcher.decode_of.pop(req.request_id, None)
            if decode is not None:  # a pair router's: to the decode instance, prefilled on inst (llm-d's protocol)
                prefill, inst = inst, decode
            url = self.cfg.backends[inst] + request.path
            self.metrics.in_flight[inst] += 1
            try:
                resp, err, retry = await self._send(request, req, inst, url, raw, stream, t0, prefill)
            finally:
                self.metrics.in_flight[inst] -= 1
            if resp is not None:
                return resp
            last_error = err
            if not retry:
                break
        self.metrics.count("502")
        return web.json_response({"error": {"message": f"no backend could serve the request: {last_error}"}},
                                 status=502)

    async def _send(self, request: web.Request, req: Request, inst: int, url: str, raw: bytes, stream: bool,
                    t0: float, prefill: int | None = None) -> tuple[web.StreamResponse | None, str, bool]:
        """(response to return, or None with the error and whether a retry is allowed); ``prefill``: the prefill
        instance of a disaggregated request, ``inst`` its decode instance."""
        rid, observe = req.request_id, self.drive.observe
        headers = {"Content-Type": "application/json"}
        legs = None
        if prefill is not None:
            legs = self.drive.pair_legs(req, prefill, inst)
            headers[PREFILLER_HEADER] = host_port(self.cfg.backends[prefill])
        on_tokens = legs.on_tokens if legs is not None else self.drive.token_observer(rid, inst)

        def at() -> int:  # where the state has the request now
            return legs.instance if legs is not None else inst
        out: web.StreamResponse | None = None
        settled = False
        try:
            async with self.session.post(url, data=raw, headers=headers) as up:
                if up.status != 200 or not stream:
                    data = await up.read()
                    now = self.now()
                    if up.status == 200:
                        n = _usage_tokens(data)
                        on_tokens(n, now)
                        observe(Finished(rid, at(), now, n))
                        self.metrics.observe_done(now - t0, now - t0)
                    else:
                        observe(Failed(rid, at(), now, f"HTTP {up.status}"))
                    self.metrics.count(str(up.status))
                    self._epoch()
                    return web.Response(body=data, status=up.status, headers=_pd_headers(up),
                                        content_type=up.content_type or "application/json"), "", False
                out = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                              "Cache-Control": "no-cache", **_pd_headers(up)})
                await out.prepare(request)
                first_s = None
                count = 0
                upstream_done = False
                try:
                    async for chunk in up.content.iter_any():
                        now = self.now()
                        await out.write(chunk)
                        count += chunk.count(b'"text":') + chunk.count(b'"content":')
                        if first_s is None:
                            first_s = now
                        on_tokens(max(count, 1), now)
                    upstream_done = True
                    await out.write_eof()
                except (ConnectionResetError, asyncio.CancelledError):
                    # the client went away; if the backend had sent everything, the request did finish
                    settled = True
                    now = self.now()
                    if upstream_done:
                        observe(Finished(rid, at(), now, max(count, 1)))
                        self.metrics.count("200")
                        self.metrics.observe_done(now - t0, (first_s if first_s is not None else now) - t0)
                    else:
                        observe(Failed(rid, at(), now, "client disconnected"))
                        self.metrics.count("client_closed")
                    self._epoch()
                    raise
                now = self.now()
                observe(Finished(rid, at(), now, max(count, 1)))
                self.metrics.count("200")
                self.metrics.observe_done(now - t0, (first_s if first_s is not None else now) - t0)
                self._epoch()
                return out, "", False
        except asyncio.CancelledError:
            if not settled:  # the client went away while the backend was still answering
                observe(Failed(rid, at(), self.now(), "client disconnected"))
                self.metrics.count("client_closed")
                self._epoch()
            raise
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
            now = self.now()
            err = f"{type(exc).__name__}: {exc}"
            observe(Failed(rid, at(), now, err))
            if isinstance(exc, aiohttp.ClientConnectionError) and self.drive.mark_down(inst):
                self.metrics.healthy[inst] = 0
            self._epoch()
            if out is not None and out.prepared:  # the client already has part of the answer: no retry
                self.metrics.count("aborted")
                return out, err, False
            return None, err, True

    async def _models(self, request: web.Request) -> web.Response:
        if self._unauthorized(request):
            return web.json_response({"error": {"message": "invalid API key"}}, status=401)
        for i in self.state.view().healthy_indices():
            try:
                async with self.session.get(self.cfg.backends[i] + "/v1/models") as up:
                    if up.status == 200:
                        return web.Response(body=await up.read(), content_type="application/json")
            except (aiohttp.ClientError, asyncio.TimeoutError):
                continue
        return web.json_response({"error": {"message": "no healthy backend"}}, status=503)

    async def _health(self, request: web.Request) -> web.Response:
        ok = bool(self.state.view().healthy_indices()) and not self._draining
        return web.Response(status=200 if ok else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.render(self.dispatcher.waiting), content_type="text/plain")

    # -- health ---------------------------------------------------------------------------
    async def _probe(self, i: int) -> bool | None:
        return await probe_health(self.session, self.cfg.backends[i])

    async def _watch_health(self) -> None:
        n = len(self.cfg.backends)
        while True:
            before = self.dispatcher.num_decisions
            ok = await self.drive.check_health(self._probe, range(n))
            self.metrics.decisions += self.dispatcher.num_decisions - before
            for i, good in enumerate(ok):
                self.metrics.healthy[i] = int(good)
            self._mem.tick()
            await asyncio.sleep(self.cfg.health_interval_s)


def _pd_headers(up: aiohttp.ClientResponse) -> dict[str, str]:
    """The TTFT split a P/D decode instance reported (``lbbench.engines.vllm.pd``), passed on to the client."""
    return {k: v for k, v in up.headers.items() if k.lower() in _PD_HEADER_NAMES}


_PD_HEADER_NAMES = frozenset(TIMING_HEADERS.values())


def _usage_tokens(data: bytes) -> int:
    try:
        return int(json.loads(data).get("usage", {}).get("completion_tokens") or 1)
    except (ValueError, AttributeError, TypeError):
        return 1


class GatewayThread:
    """The gateway served from a background thread (tests, benchmarks):
    ``with GatewayThread(cfg) as gw: gw.url``."""

    def __init__(self, cfg: ProxyConfig, host: str = "127.0.0.1", port: int = 0):
        self.gateway = Gateway(cfg)
        self.host, self.port = host, port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lbbench-proxy", daemon=True)
        self.url = ""

    def __enter__(self) -> "GatewayThread":
        self._thread.start()

        async def start():
            self._runner = web.AppRunner(self.gateway.app(), access_log=None, handle_signals=False)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.port)
            await site.start()
            return site._server.sockets[0].getsockname()[1]
        port = asyncio.run_coroutine_threadsafe(start(), self._loop).result(30)
        self.url = f"http://{self.host}:{port}"
        return self

    def call(self, coro_fn, *args, timeout_s: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro_fn(*args), self._loop).result(timeout_s)

    def __exit__(self, *exc) -> None:
        async def stop():
            await self._runner.cleanup()
        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
