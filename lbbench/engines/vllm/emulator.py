"""Emulated vLLM instances: OpenAI-compatible HTTP servers timed by the simulator.

Each ``EmulatedInstance`` is an aiohttp application that serves
``/v1/completions`` and ``/v1/chat/completions`` (streaming or not, with
``usage``), ``/health``, ``/v1/models`` and ``/metrics`` (vLLM's metric names),
and times every request with the simulator's instance model
(``lbbench.sim.instance.SimInstance``) on the wall clock: a request is added to
the engine when it arrives, the engine is advanced as real time passes, and each
token is streamed at the end of the engine step that produced it. The whole HTTP
path (client, routers, fault handling) can so be exercised at paper-like
timings without GPUs; ``lbbench serve-sim`` runs a fleet of them.

Output length is always ``max_tokens`` (the engine never stops early, as with
vLLM's ``ignore_eos``); prompt length is the number of token ids, or about one
token per four characters of text. Generated tokens are deterministic ids with
text ``" t<id>"``.

``zero_latency_profile()`` makes every engine step take a microsecond, for
measuring the client alone. ``EmulatorFleet`` runs a fleet in a background
thread (tests, benchmarks) and can ``kill`` one instance abruptly: it stops
listening and drops every open connection, as a crashed server would. A fleet
started with ``allow_kill`` (``serve-sim --allow-kill``) also lets a client crash
one instance with ``POST /lbbench/kill``.

Every instance speaks llm-d's P/D sidecar protocol (``lbbench.engines.vllm.pd``): it takes a prefill leg or a
remote-prefill decode, and a request sent with the ``x-prefiller-host-port`` header is prefilled there first, its
KV moved over the fleet's link (``FleetConfig.kv_link``), then decoded here. A fleet's roles
(``serve-sim --fleet NAME:N:prefill,NAME:N:decode``) are for the routers in front of it.

A token-id prompt is cached by content, as vLLM's prefix cache does
(``kv_publisher.content_request``); with ``kv_events_port_base`` (``serve-sim
--kv-events-port-base``) instance ``i`` publishes its KV events on that port plus
``i`` in vLLM's wire format (``kv_publisher.KVEventPublisher``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass

from aiohttp import web

from ... import __version__
from ...core import Failed, Finished, FirstToken, Request
from ...kv_links import DEFAULT_LINK, LINKS, KVFabric, parse_kv_link
from ...profiles import Profile, load_profile
from ...sim.instance import SimInstance
from . import pd
from .kv_publisher import KVEventPublisher, content_request, prompt_token_ids
from .metrics_page import render_metrics


def zero_latency_profile() -> Profile:
    """A profile whose engine steps take 1 microsecond and whose capacity is huge."""
    return Profile(
        name="zero", description="emulator profile with (almost) zero latency, for client benchmarks",
        model="sim", hardware="none", base_s=1e-6, prefill_token_s=0.0, decode_seq_s=0.0,
        context_token_s=0.0, num_kv_blocks=1 << 22, block_size=16, max_num_seqs=1 << 16,
        max_num_batched_tokens=1 << 24, max_model_len=1 << 20, chunked_prefill=True, grad1=0.0,
        grad2=0.0, epsilon=0.0, alpha=0.5, min_step_s=0.001,
        source={"all": "synthetic: measures the HTTP client, not an engine"})


def resolve_profile(name: str) -> Profile:
    """``zero`` -> :func:`zero_latency_profile`; anything else through ``load_profile``."""
    if name == "zero":
        return zero_latency_profile()
    return load_profile(name)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_range(n: int, host: str = "127.0.0.1", attempts: int = 100) -> int:
    """A base port ``p`` such that ``p .. p+n-1`` were all free just now (for
    ``--port-base`` style options that number instances consecutively)."""
    for _ in range(attempts):
        p = free_port(host)
        if p + n > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for i in range(n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, p + i))
            return p
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {n} consecutive free ports on {host}")


def _token_id(rid: int, j: int) -> int:
    return 100 + (rid * 31 + j * 7) % 900


class _Stream:
    __slots__ = ("rid", "prompt_tokens", "output_tokens", "avail", "done", "error", "event")

    def __init__(self, rid: int, prompt_tokens: int, output_tokens: int):
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.avail = 0
        self.done = False
        self.error: str | None = None
        self.event = asyncio.Event()


class _BadRequest(ValueError):
    pass


def _prompt_tokens(body: dict, chat: bool) -> int:
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _BadRequest("'messages' must be a non-empty list")
        text = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        return max(1, round(len(text) / 4)) + 3 * len(msgs)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return max(1, round(len(prompt) / 4))
    raise _BadRequest("'prompt' must be a string or a list of token ids")


class EmulatedInstance:
    """One emulated server: an aiohttp app around a ``SimInstance``."""

    def __init__(self, profile: Profile, index: int = 0, model: str | None = None,
                 scheduler: str = "fcfs", chunked_prefill: bool | None = None, allow_kill: bool = False,
                 fabric: KVFabric | None = None, kv_events: str | None = None,
                 prefix_caching: bool | None = None):
        self.profile = profile
        #: the link its KV transfers book (one per fleet; ``lbbench.engines.vllm.pd``)
        self.fabric = fabric if fabric is not None else KVFabric(LINKS[DEFAULT_LINK])
        self.landed: "deque[pd._Landing]" = deque()  # KV landed, waiting for blocks (``pd.admit``)
        self.kv_retry_s: float | None = None  # when ``pd.admit`` tries the landed KV again
        self.sidecar_session = None  # the P/D sidecar's client session, opened on its first prefill leg
        self.num_prefill_legs = 0  # prefill legs served (``do_remote_decode``)
        self.num_kv_received = 0  # decodes of a KV prefilled elsewhere
        self.kv_events = kv_events  # the ZMQ address its KV events are published on (None: not published)
        self.kv_publisher: KVEventPublisher | None = None
        self.index = index
        self.model = model or profile.model or "sim"
        self.sim = SimInstance(profile, index=index, scheduler=scheduler, chunked_prefill=chunked_prefill,
                               prefix_caching=prefix_caching)
        self._priority: dict[int, int] = {}  # request -> the `priority` field it was sent with
        self.sim.priority_of = lambda r: self._priority.get(r.request_id, 0)
        self.streams: dict[int, _Stream] = {}
        self._ids = itertools.count()
        self._wake: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._driver: asyncio.Task | None = None
        self._transports: set = set()
        self.runner: web.AppRunner | None = None
        self.site: web.TCPSite | None = None
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_finished_total = 0
        self.alive = False
        self.allow_kill = allow_kill

    @property
    def engine_id(self) -> str:
        """Its P/D engine id (``remote_engine_id``) and link endpoint: its address."""
        return pd.host_port(self.url)

    # -- clock -----------------------------------------------------------------------
    def now(self) -> float:
        return self._loop.time() - self._t0

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, host: str, port: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        if self.kv_events is not None:
            self.kv_publisher = KVEventPublisher(self.kv_events, self.profile.block_size)
            self.sim.kv.subscribe(self.kv_publisher.on_event)
        app = web.Application(client_max_size=64 << 20)
        app.add_routes([
            web.get("/health", self._health), web.get("/v1/models", self._models),
            web.get("/metrics", self._metrics), web.get("/version", self._version),
            web.get("/server_info", self._server_info),
            web.post("/v1/completions", self._completions),
            web.post("/v1/chat/completions", self._chat),
        ])
        if self.allow_kill:
            app.add_routes([web.post("/lbbench/kill", self._kill)])
        # handler_cancellation: a client that disconnects cancels its handler, whose ``_forget`` aborts the request,
        # as vLLM aborts a request whose client went away (aiohttp >= 3.9 keeps the handler running by default)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5,
                                    handler_cancellation=True)
        await self.runner.setup()
        self.site = web.TCPSite(self.runner, host, port, reuse_address=True)
        await self.site.start()
        self.url = f"http://{host}:{port}"
        self._driver = asyncio.create_task(self._drive())
        self.alive = True

    async def stop(self) -> None:
        self.alive = False
        if self._driver is not None:
            self._driver.cancel()
            await asyncio.gather(self._driver, return_exceptions=True)
        if self.runner is not None:
            await self.runner.cleanup()
        if self.sidecar_session is not None:
            await self.sidecar_session.close()
        self._close_publisher()

    def _close_publisher(self) -> None:
        if self.kv_publisher is not None:
            self.sim.kv.unsubscribe(self.kv_publisher.on_event)
            self.kv_publisher.close()
            self.kv_publisher = None

    async def kill(self) -> None:
        """Die abruptly: stop listening and drop every open connection."""
        self.alive = False
        if self.site is not None:
            await self.site.stop()
        for tr in list(self._transports):
            tr.abort()
        self._transports.clear()
        if self._driver is not None:
            self._driver.cancel()
        if self.runner is not None:
            await self.runner.cleanup()
        self._close_publisher()

    # -- the engine, on the wall clock -----------------------------------------------
    def _poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _progress(self, now_s: float) -> tuple[int, float | None]:
        """Steps of the running pure-decode segment finished by ``now_s`` and the end
        of the next step (``SimInstance.segment_progress``)."""
        return self.sim.segment_progress(now_s)

    def _apply(self, events: list) -> None:
        """Hand engine events to the streams waiting on them."""
        streams = self.streams
        for ev in events:
            s = streams.get(getattr(ev, "request_id", -1))
            if s is None:
                continue
            if isinstance(ev, Finished):
                s.avail = s.output_tokens
                s.done = True
                s.event.set()
                self.generation_tokens_total += s.output_tokens
                self.num_finished_total += 1
            elif isinstance(ev, FirstToken):
                r = self.sim.reqs.get(s.rid)
                s.avail = max(s.avail, self.sim.generated_tokens(s.rid) if r is not None else 1)
                s.event.set()
            elif isinstance(ev, Failed):
                s.error = ev.error
                s.done = True
                s.event.set()

    async def _drive(self) -> None:
        loop = self._loop
        sim = self.sim
        streams = self.streams
        while True:
            now = self.now()
            retry_s = pd.admit(self, now) if self.landed else None  # at the step boundary it waited for
            self._apply(sim.advance(now))
            m, next_step = self._progress(now)
            if streams:
                for s in streams.values():
                    if s.done:
                        continue
                    if sim.is_decoding(s.rid):
                        g = sim.generated_tokens(s.rid) + m
                        if g > s.avail:
                            s.avail = g
                            s.event.set()
            wake_at = sim.next_event_s()
            if retry_s is not None and (wake_at is None or retry_s < wake_at):
                wake_at = retry_s
            if next_step is not None and (wake_at is None or next_step < wake_at):
                wake_at = next_step
            self._wake = loop.create_future()
            if wake_at is not None:
                handle = loop.call_at(self._t0 + wake_at, self._poke)
                await self._wake
                handle.cancel()
            else:
                await self._wake

    def _submit(self, prompt_tokens: int, output_tokens: int, priority: int = 0,
                token_ids: list[int] | None = None) -> _Stream:
        """A request whose prompt is computed here (``token_ids``: its prompt, cached by content)."""
        s = self._new_stream(prompt_tokens, output_tokens, priority)
        now = self.now()
        if token_ids is None:
            req = Request(s.rid, now, prompt_tokens, output_tokens)
        else:
            req = content_request(s.rid, now, token_ids, output_tokens, self.profile.block_size)
            if self.kv_publisher is not None:
                self.kv_publisher.remember(req, token_ids)
        self._apply(self.sim.add(req, now))
        self._poke()
        return s

    def _new_stream(self, prompt_tokens: int, output_tokens: int, priority: int) -> _Stream:
        rid = next(self._ids)
        self._priority[rid] = priority
        s = _Stream(rid, prompt_tokens, output_tokens)
        self.streams[rid] = s
        self.prompt_tokens_total += prompt_tokens
        return s

    async def _submit_remote(self, prompt_tokens: int, output_tokens: int, priority: int, params: dict,
                             timing: dict[str, float]) -> _Stream:
        """A decode whose KV was prefilled elsewhere (``pd.receive_kv``): it enters the engine when the KV has
        landed and its blocks fit."""
        s = self._new_stream(prompt_tokens, output_tokens, priority)
        try:
            await pd.receive_kv(self, Request(s.rid, self.now(), prompt_tokens, output_tokens), params, timing)
        except BaseException:
            self.streams.pop(s.rid, None)
            self._priority.pop(s.rid, None)
            raise
        return s

    def _forget(self, s: _Stream) -> None:
        self.streams.pop(s.rid, None)
        self._priority.pop(s.rid, None)
        if not s.done:
            self.sim.abort(s.rid)
            self._poke()

    # -- HTTP handlers ---------------------------------------------------------------
    async def _kill(self, request: web.Request) -> web.Response:
        """Fault injection (``serve-sim --allow-kill``): crash this instance just
        after answering."""
        def crash() -> None:
            self._kill_task = asyncio.ensure_future(self.kill())
        asyncio.get_running_loop().call_later(0.05, crash)
        return web.json_response({"killed": self.index})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "owned_by": "lbbench",
             "max_model_len": self.profile.max_model_len}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        sim = self.sim
        text = render_metrics(self.model, sim.num_running, sim.num_waiting, sim.kv_usage,
                              sim.num_preemptions, self.prompt_tokens_total,
                              self.generation_tokens_total, self.num_finished_total,
                              cache_config={"block_size": self.profile.block_size,
                                            "num_gpu_blocks": self.profile.num_kv_blocks,
                                            "enable_prefix_caching": self.profile.enable_prefix_caching})
        return web.Response(text=text, content_type="text/plain")

    async def _version(self, request: web.Request) -> web.Response:
        """As vLLM answers it (gateways probe it to recognise a vLLM worker)."""
        return web.json_response({"version": f"{__version__}+lbbench-serve-sim"})

    async def _server_info(self, request: web.Request) -> web.Response:
        p = self.profile
        return web.json_response({"engine": "lbbench serve-sim", "profile": p.name, "model": self.model,
                                  "max_model_len": p.max_model_len, "max_num_seqs": p.max_num_seqs,
                                  "max_num_batched_tokens": p.max_num_batched_tokens,
                                  "block_size": p.block_size, "num_gpu_blocks": p.num_kv_blocks,
                                  "scheduler": self.sim.scheduler})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    def _chunk(self, s: _Stream, chat: bool, n: int, finish: str | None, want_ids: bool) -> bytes:
        ids = [_token_id(s.rid, j) for j in range(s.avail - n, s.avail)] if n else []
        text = "".join(f" t{i}" for i in ids)
        choice: dict = {"index": 0, "finish_reason": finish}
        if chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        if want_ids:
            choice["token_ids"] = ids
        obj = {"id": f"cmpl-{self.index}-{s.rid}",
               "object": "chat.completion.chunk" if chat else "text_completion",
               "created": int(time.time()), "model": self.model, "choices": [choice]}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    def _usage(self, s: _Stream) -> dict:
        return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.avail,
                "total_tokens": s.prompt_tokens + s.avail}

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError as exc:
            return web.json_response({"error": {"message": str(exc), "type": "BadRequestError",
                                                "code": 400}}, status=400)
        prefiller = request.headers.get(pd.PREFILLER_HEADER)
        if prefiller and isinstance(body, dict):  # llm-d's decode sidecar: the prefill leg first
            return await pd.run_sidecar(self, request, body, chat, prefiller)
        return await self._serve_body(request, body, chat)

    async def _serve_body(self, request: web.Request, body: object, chat: bool,
                          timing: dict[str, float] | None = None) -> web.StreamResponse:
        """Serve one request's ``body`` (``timing``: the P/D split so far, from the sidecar)."""
        try:
            if not isinstance(body, dict):
                raise _BadRequest("body must be a JSON object")
            prompt_tokens = _prompt_tokens(body, chat)
            max_tokens = body.get("max_tokens")
            if max_tokens is None:
                max_tokens = body.get("max_completion_tokens")
            if max_tokens is None:
                max_tokens = 16
            if not isinstance(max_tokens, int) or max_tokens < 1:
                raise _BadRequest("'max_tokens' must be a positive integer")
            priority = body.get("priority", 0)
            if not isinstance(priority, int) or isinstance(priority, bool):
                raise _BadRequest("'priority' must be an integer")
            if priority != 0 and self.sim.scheduler != "priority":  # as vLLM answers under fcfs
                raise _BadRequest(f"Got priority {priority} but Priority scheduling is not enabled.")
            remote = pd.remote_prefill(body)
            prefill_leg = pd.is_remote_decode(body)
        except (ValueError, _BadRequest) as exc:
            return web.json_response({"error": {"message": str(exc), "type": "BadRequestError",
                                                "code": 400}}, status=400)
        if body.get("model") not in (None, self.model):
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does "
                                                "not exist.", "type": "NotFoundError", "code": 404}},
                                     status=404)
        headers: dict[str, str] = {}
        if remote is not None:
            timing = dict(timing or {})
            s = await self._submit_remote(prompt_tokens, max_tokens, priority, remote, timing)
            headers = pd.timing_headers(timing)
        else:
            s = self._submit(prompt_tokens, max_tokens, priority, None if chat else prompt_token_ids(body))
            self.num_prefill_legs += prefill_leg
        if s.error is not None:
            self.streams.pop(s.rid, None)
            return web.json_response({"error": {"message": s.error, "type": "BadRequestError",
                                                "code": 400}}, status=400)
        tr = request.transport
        if tr is not None:
            self._transports.add(tr)
        try:
            if body.get("stream"):
                return await self._stream(request, s, chat, body, headers)
            while not s.done:
                await s.event.wait()
                s.event.clear()
            if s.error is not None:
                return web.json_response({"error": {"message": s.error, "code": 500}}, status=500)
            ids = [_token_id(s.rid, j) for j in range(s.avail)]
            text = "".join(f" t{i}" for i in ids)
            choice: dict = {"index": 0, "finish_reason": "length"}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            if body.get("return_token_ids"):
                choice["token_ids"] = ids
            answer = {"id": f"cmpl-{self.index}-{s.rid}", "object": "chat.completion" if chat else "text_completion",
                      "created": int(time.time()), "model": self.model, "choices": [choice], "usage": self._usage(s)}
            if prefill_leg:  # where its KV is, for the decode instance (llm-d's step 3)
                answer[pd.KV_TRANSFER_PARAMS] = pd.prefill_params(self, prompt_tokens)
            return web.json_response(answer, headers=headers)
        finally:
            self._forget(s)
            if tr is not None:
                self._transports.discard(tr)

    async def _stream(self, request: web.Request, s: _Stream, chat: bool, body: dict,
                      headers: dict[str, str] | None = None) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           **(headers or {})})
        await resp.prepare(request)
        want_ids = bool(body.get("return_token_ids"))
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        sent = 0
        while True:
            await s.event.wait()
            s.event.clear()
            if s.error is not None:
                err = {"error": {"message": s.error, "type": "InternalServerError", "code": 500}}
                await resp.write(b"data: " + json.dumps(err).encode() + b"\n\n")
                break
            n = s.avail - sent
            if n > 0:
                sent = s.avail
                finish = "length" if s.done and sent >= s.output_tokens else None
                await resp.write(self._chunk(s, chat, n, finish, want_ids))
            if s.done:
                break
        if usage and s.error is None:
            obj = {"id": f"cmpl-{self.index}-{s.rid}",
                   "object": "chat.completion.chunk" if chat else "text_completion",
                   "created": int(time.time()), "model": self.model, "choices": [],
                   "usage": self._usage(s)}
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@dataclass
class FleetConfig:
    profile: Profile
    num_instances: int = 2
    #: one profile per instance (a mixed fleet, ``Fleet.profiles()``); None: ``num_instances`` x ``profile``
    profiles: list[Profile] | None = None
    host: str = "127.0.0.1"
    port_base: int | None = None  # None: free ports
    model: str | None = None
    scheduler: str = "fcfs"
    chunked_prefill: bool | None = None
    allow_kill: bool = False  # serve POST /lbbench/kill (fault injection)
    #: the link between the fleet's instances for prefill/decode (``lbbench.kv_links.parse_kv_link``); any instance
    #: takes either leg (``lbbench.engines.vllm.pd``), a fleet's roles are for its routers
    kv_link: str = DEFAULT_LINK
    kv_events_port_base: int | None = None  # instance i publishes KV events on tcp://host:base+i (None: off)
    prefix_caching: bool | None = None  # None: as the profile says

    def instance_profiles(self) -> list[Profile]:
        return list(self.profiles) if self.profiles is not None else [self.profile] * self.num_instances


async def start_fleet(cfg: FleetConfig) -> list[EmulatedInstance]:
    """Start one emulated server per instance, each timed by its own profile, on consecutive (or free) ports."""
    out = []
    fabric = KVFabric(parse_kv_link(cfg.kv_link))
    for i, profile in enumerate(cfg.instance_profiles()):
        port = cfg.port_base + i if cfg.port_base is not None else free_port(cfg.host)
        inst = EmulatedInstance(profile, index=i, model=cfg.model, scheduler=cfg.scheduler,
                                chunked_prefill=cfg.chunked_prefill, allow_kill=cfg.allow_kill, fabric=fabric,
                                kv_events=None if cfg.kv_events_port_base is None
                                else f"tcp://{cfg.host}:{cfg.kv_events_port_base + i}",
                                prefix_caching=cfg.prefix_caching)
        try:
            await inst.start(cfg.host, port)
        except OSError as exc:
            for o in out:
                await o.stop()
            raise OSError(f"port: cannot listen on {cfg.host}:{port}: {exc.strerror or exc}") from None
        inst.url = f"http://{cfg.host}:{port}"
        out.append(inst)
    return out


class EmulatorFleet:
    """A fleet of emulated instances served from a background thread.

    ``with EmulatorFleet(FleetConfig(profile, 2)) as fleet: fleet.endpoints``;
    ``fleet.kill(i)`` crashes instance ``i``.
    """

    def __init__(self, cfg: FleetConfig):
        self.cfg = cfg
        self.instances: list[EmulatedInstance] = []
        self.endpoints: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="serve-sim", daemon=True)

    def __enter__(self) -> "EmulatorFleet":
        self._thread.start()
        self.instances = asyncio.run_coroutine_threadsafe(start_fleet(self.cfg), self._loop).result(30)
        self.endpoints = [inst.url for inst in self.instances]
        return self

    def kill(self, index: int) -> None:
        asyncio.run_coroutine_threadsafe(self.instances[index].kill(), self._loop).result(10)

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the fleet's loop thread and return its result."""
        async def _c():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(_c(), self._loop).result(10)

    def __exit__(self, *exc) -> None:
        async def _stop():
            for inst in self.instances:
                if inst.alive:
                    await inst.stop()
            # idle keep-alive connections still have handler tasks: end them too
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
        try:
            asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


async def serve_forever(cfg: FleetConfig, on_ready=None) -> None:
    """Run a fleet in the current loop until cancelled (the ``serve-sim`` command)."""
    fleet = await start_fleet(cfg)
    try:
        if on_ready is not None:
            on_ready([inst.url for inst in fleet])
        await asyncio.Event().wait()
    finally:
        for inst in fleet:
            await inst.stop()
