"""Live replay: a workload sent over HTTP through the same dispatcher as the simulator.

``run_replay`` drives ``lbbench.dispatch.Dispatcher`` and
``lbbench.core.ClusterState`` through the live decision loop the proxy uses too
(``lbbench.live.drive.Drive``) — the very objects the simulator drives in virtual
time — so a router cannot tell the two apart. Decision epochs are the simulator's:
an arrival, a completion, and every ``min_step_s`` while requests wait after the
router deferred.

The schedule is open loop and absolute: request *i* reaches the load balancer
at ``start + arrival_s`` (never a chain of relative sleeps), so a slow
response never delays later arrivals. Each record carries

- ``planned_send_s``: when the request should have left the client:
  ``arrival_s`` plus the time the router chose to hold it (deferral), so that
  ``actual_send_s - planned_send_s`` (the *dispatch lag*) measures the client
  alone and not the routing policy;
- ``actual_send_s``: when the HTTP request left the client;
- ``dispatch_s``: when the router dispatched it (so ``dispatch_s - arrival_s``
  is the router wait, as in the simulator).

Lifecycle events fed to the state: ``Dispatched`` (by the dispatcher),
``FirstToken``, ``TokensGenerated`` (at most one per request per
``min_step_s``), ``Finished`` / ``Failed``, ``InstanceHealth`` (an instance
whose requests fail with connection errors is marked down until its
``/health`` answers again) and ``MetricsSample`` (``/metrics`` scraped every
``scrape_interval_s``).

Every record goes to a ``RecordLog`` (``lbbench.rundir.records``) as soon
as its request ends: appended to ``out_dir/requests.partial.jsonl`` and written
in Parquet chunks, so the client holds no record in memory however long the
run (``result.frame()`` scans them; ``result.records`` reads them back). Ctrl-C
or SIGTERM stops the run: finished requests are kept and the result says
``complete=False``.

Flow control and stale signals are the simulator's and the proxy's, on the same ``Drive``: with ``admission``
(``lbbench.admission``) an arriving request is held at the client's gateway while the endpoints are full and
released by band and tenant; one shed over ``max_queue`` is never sent and gets its record at once, with
``http_status`` 429 (rejected on arrival) or 503 (displaced), ``instance`` -1 and the error the simulator gives it.
With ``signal_lag_s`` the router sees what the endpoints report that much later.

With ``load_workers=N`` (``lbbench.live.load_workers``) this process keeps the
schedule, the router, the state and the records, and N worker processes (or Ray
actors) send and read the streams. The router then decides each request
``send_lead_s`` before its arrival (the state it sees is that much older, as it
already is by up to ``min_step_s`` for token counts) and the worker sends it at
``planned_send_s`` on the driver's clock, read through its measured clock offset:
this process's own delays no longer reach the send times. A record's
``dispatch_s`` is then the time the decision takes effect (its planned send),
never before its arrival. A worker that dies stops the run, incomplete, with
what had finished.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

import aiohttp
import polars as pl

from ..admission import AdmissionSpec, shed_message
from ..core import (Failed, Finished, FirstToken, InstanceSpec, MetricsSample, Request, RequestRecord,
                    TokensGenerated, chain_sessions)
from ..dispatch import Router
from ..engines import Engine, get_engine
from ..engines.vllm.pd import PREFILLER_HEADER, host_port
from ..errors import InputError
from ..live.http import HttpBackend, StreamResult, prompt_token_ids
from ..live.drive import Drive, new_event_loop, probe_health, quiet_gc
from ..live.load_workers import LoadWorkers, LoadWorkerSettings, worker_summary
from ..live.memtrace import MemTrace
from ..live.metrics import parse_metrics
from ..live.saturation import SaturationDetector, SaturationPolicy, sample_interval
from ..live.workers import StreamWorkers, WorkerSettings
from ..rundir import RecordLog

#: the error of a request never sent because its step saturated, and of one aborted in flight (``cancel``)
NOT_SENT = "not sent: saturated"
CANCELLED = "cancelled: saturated"
#: The scheduler wakes this much before an arrival and yields to other tasks
#: until it is due (the event loop's sleeps are only millisecond-precise); at
#: 1000 req/s this costs up to half a core, at 80 req/s a few percent.
EARLY_WAKE_S = 0.0005
#: with load workers, arrivals due within this much are decided together (their lead grows by at most this)
SLACK_S = 0.002
METRICS_SCHEMA = {"time_s": pl.Float64, "instance": pl.Int64, "num_running": pl.Int64,
                  "num_waiting": pl.Int64, "kv_usage": pl.Float64, "num_preemptions": pl.Int64}


class EndpointError(InputError):
    """An endpoint cannot be used (the message starts with `endpoint URL:`; the CLI maps it to `--endpoint`)."""


def normalize_endpoint(url: str) -> str:
    """``host:port``, ``http://host:port/`` or ``.../v1`` -> ``http://host:port``."""
    u = url.strip()
    if not u:
        raise EndpointError("endpoint: empty URL")
    if "://" not in u:
        u = "http://" + u
    u = u.rstrip("/")
    if u.endswith("/v1"):
        u = u[:-3]
    return u


def _get(url: str, timeout_s: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - user-given endpoint
        return resp.read()


def served_models(endpoint: str, timeout_s: float = 5.0) -> list[str]:
    """Model ids listed by ``/v1/models``."""
    data = json.loads(_get(normalize_endpoint(endpoint) + "/v1/models", timeout_s))
    return [str(m["id"]) for m in data.get("data", [])]


def check_endpoints(endpoints: Sequence[str], timeout_s: float = 5.0) -> list[str]:
    """Check every endpoint answers (``/health``, else ``/v1/models``).

    Returns the normalized URLs; raises ``EndpointError("endpoint URL:
    unreachable: ...")`` for the first that does not.
    """
    if not endpoints:
        raise EndpointError("endpoint: no endpoints given")
    out = []
    for raw in endpoints:
        url = normalize_endpoint(raw)
        try:
            try:
                _get(url + "/health", timeout_s)
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
                _get(url + "/v1/models", timeout_s)
        except urllib.error.HTTPError as exc:
            raise EndpointError(f"endpoint {raw}: unhealthy: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EndpointError(f"endpoint {raw}: unreachable: {reason}") from None
        out.append(url)
    return out


@dataclass
class ReplayResult:
    """What a live replay produced: its records are in ``log`` (on disk), read lazily by ``frame()``."""

    log: RecordLog
    metrics: pl.DataFrame
    complete: bool
    #: request id -> arrival time of each streamed token (run clock, seconds)
    token_times: dict[int, list[float]] = field(default_factory=dict)
    #: "SIGINT" / "SIGTERM" when the run was stopped early
    interrupted: str | None = None
    duration_s: float = 0.0
    endpoints: list[str] = field(default_factory=list)
    model: str = ""
    #: ``time.monotonic()`` at the run clock's zero (to line up outside events)
    clock_origin_s: float = 0.0
    #: load workers: one row per worker (id, host, pid, clock offset and its error bound, requests, lag p50/p99)
    load_workers: list[dict] = field(default_factory=list)
    #: load workers: each worker's clock offset (s, the last measured), by worker id: ``frame()``'s
    #: ``clock_offset_s``
    clock_offsets: list[float] | None = None
    #: request id -> when this process learnt that the request failed (run clock; failed records have no finish)
    failure_times: dict[int, float] = field(default_factory=dict)
    #: run-clock time the backlog was found saturated (``saturation``), else None
    saturated_at_s: float | None = None
    #: with ``settings.kv_events``: what the KV-event subscriber read (``KVEventFeed.summary``), else None
    kv_events: dict | None = None
    #: the backlog's growth (requests/s) over the window that saturated
    saturation_slope_per_s: float | None = None

    @property
    def num_records(self) -> int:
        return self.log.num_records

    def frame(self) -> pl.LazyFrame:
        """Every record, in the order the requests ended: the ``requests.parquet`` columns (``RecordLog``), and
        with load workers ``load_worker`` and ``clock_offset_s`` (its worker's last measured offset)."""
        lf = self.log.frame()
        if self.clock_offsets is None:
            return lf
        ids = list(range(len(self.clock_offsets)))
        return lf.with_columns(pl.col("load_worker").replace_strict(ids, self.clock_offsets, default=None,
                                                                    return_dtype=pl.Float64).alias("clock_offset_s"))

    @cached_property
    def records(self) -> list[RequestRecord]:
        """Every record as a ``RequestRecord``, in the order the requests ended (read back from the log)."""
        return self.log.records()


@dataclass(frozen=True, kw_only=True)
class ReplaySettings:
    """How a live replay runs (``run_replay``): every knob but the requests, the router and the endpoints."""

    run_id: str
    """The records' ``run_id``."""
    seed: int
    """The records' ``seed``."""
    model: str | None = None
    """The model to request; None: the first model the first endpoint serves."""
    specs: Sequence[InstanceSpec] | None = None
    """One ``InstanceSpec`` per endpoint: what the router may know about each instance's capacity (None: the
    default spec for each)."""
    out_dir: str | Path | None = None
    """Where the records stream to (``lbbench.rundir.RecordLog``); None: a temporary folder kept with the
    result."""
    scrape_interval_s: float | None = 1.0
    """Seconds between ``/metrics`` scrapes of every endpoint (None: no scraping)."""
    request_timeout_s: float = 600.0
    """Seconds before a request is recorded as failed."""
    api: str = "completions"
    """``completions`` or ``chat``."""
    min_step_s: float = 0.02
    """The decision epoch: deferred requests are offered to the router again this often."""
    progress: Callable[[int, int], None] | None = None
    """Called with (requests ended, requests) as the run goes."""
    health_interval_s: float = 0.5
    """Seconds between health probes of an endpoint that stopped answering."""
    stall_timeout_s: float = 30.0
    """Seconds without any progress after which the run stops, incomplete."""
    warm_connections: int = 16
    """Keep-alive connections opened per endpoint before the clock starts."""
    early_wake_s: float = EARLY_WAKE_S
    """The scheduler yields in a loop for this long before each arrival: a little CPU for sub-millisecond send
    precision (0: off)."""
    priority_of: Callable[[Request, int], int] | None = None
    """``priority_of(request, instance)``: the ``priority`` field each request is sent with to that instance
    (servers under vLLM's priority scheduling policy)."""
    prompt_texts: dict[int, str] | None = None
    """Request id -> text (``lbbench.harness.text_prompts``): replaces token-id prompts for endpoints that take
    only text."""
    engine: Engine | str | None = None
    """The endpoints' engine (``lbbench.engines``; None: vLLM): its request fields and metric names."""
    label: str | None = None
    """The records' ``router`` column (None: the router's name)."""
    stream_workers: int = 0
    """> 0: send and read the streams in that many worker processes (``lbbench.live.workers``), leaving this
    process only the schedule, the decisions and the records."""
    load_workers: int = 0
    """> 0 (``lbbench.live.load_workers``): the router decides ``send_lead_s`` ahead of each arrival and the
    workers send at the planned times on this process's clock; ``result.load_workers`` has each worker's clock
    offset and dispatch lag. Not with ``stream_workers``."""
    ray: bool = False
    """Load workers as Ray actors (the caller has connected to a cluster)."""
    send_lead_s: float = 0.02
    """With load workers: how long before an arrival the router decides it and hands it to its worker."""
    keep_token_times: bool = True
    """False leaves ``result.token_times`` empty: a long run then holds only its records (a few hundred bytes
    each; every token's time costs about 32 bytes more)."""
    admission: AdmissionSpec | None = None
    """Flow control (``lbbench.admission``): requests held while the endpoints are full, shed (429/503, recorded,
    never sent) over ``max_queue``; None: every request is sent."""
    signal_lag_s: float = 0.0
    """The router sees what the endpoints report (tokens, finishes, health, metrics) this many seconds late."""
    saturation: SaturationPolicy | None = None
    """Samples the backlog (arrived, not yet ended) and marks the run saturated when it keeps growing faster than
    the policy's threshold over its window (``result.saturated_at_s``); unless the policy only marks, sending then
    stops: every request not yet sent is recorded with error ``not sent: saturated`` and, with ``cancel``, every
    request in flight is aborted and recorded as failed with ``cancelled: saturated`` (``drain`` lets them
    finish). The result stays complete: every request has its record."""
    kv_events: Sequence[str | None] | None = None
    """One ZMQ address per endpoint (None for one that publishes nothing): the instances' KV-event publishers
    (vLLM's ``--kv-events-config``, ``serve-sim --kv-events-port-base``), read by ``lbbench.live.kv_events`` into
    the index of a router that reads KV events (``precise_prefix``)."""


class _Replay:
    def __init__(self, requests: Sequence[Request], router: Router, endpoints: list[str], model: str,
                 specs: Sequence[InstanceSpec], settings: ReplaySettings):
        self.s = settings
        saturation = settings.saturation
        self.detector = (SaturationDetector(saturation.threshold_per_s, saturation.window_s)
                         if saturation is not None else None)
        self.stopped_sending = False  # saturated: nothing more is sent
        self._next_i = 0  # the next request of the schedule to arrive
        self.engine = get_engine(settings.engine)
        self.label = settings.label or router.name
        self.workers = None
        self.num_load_workers = settings.load_workers
        self.lw = None  # LoadWorkers
        self.lead_s = settings.send_lead_s if settings.load_workers else 0.0
        self.no_lead: set[int] = set()  # session turns: they arrive when due, not ahead
        self.worker_rec: dict[int, int] = {}  # request id -> load worker
        #: requests handed to stream workers: id -> (request, instance, dispatch_s, planned_s)
        self.remote: dict[int, tuple[Request, int, float, float]] = {}
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        # closed-loop sessions: a later turn is sent once the turn before it finished, plus its think time
        self._stream, self._next_turn = chain_sessions(self.requests)
        self.router = router
        self.endpoints = endpoints
        self.model = model
        self.out_dir = Path(settings.out_dir) if settings.out_dir is not None else None
        self.drive = Drive(router, specs, min_step_s=settings.min_step_s, on_dispatch=self._dispatched,
                           on_error=self._crash, admission=settings.admission, on_shed=self._shed,
                           signal_lag_s=settings.signal_lag_s)
        self.state = self.drive.state
        self.log: RecordLog | None = None  # the records (``run``)
        self.token_times: dict[int, list[float]] = {}
        self.failure_times: dict[int, float] = {}
        self.metric_rows: list[tuple] = []
        self.arrived_at: dict[int, float] = {}
        #: requests this process streams: task -> (request, instance, dispatch_s, planned_s)
        self.in_flight: dict[asyncio.Task, tuple[Request, int, float, float]] = {}
        self.num_arrived = 0
        self.interrupted: str | None = None
        self.error: BaseException | None = None
        self.finished = asyncio.Event()  # every request has its record
        self.stop = asyncio.Event()  # interrupted, or a task crashed
        self._last_progress_s = 0.0
        self.kv_feed = None  # KVEventFeed (``settings.kv_events``)

    # -- clock ---------------------------------------------------------------------------
    def now(self) -> float:
        return self.drive.now()

    # -- main ----------------------------------------------------------------------------
    async def run(self) -> ReplayResult:
        self.loop = asyncio.get_running_loop()
        self.log = RecordLog(self.out_dir, load_workers=bool(self.num_load_workers))
        wall0 = time.perf_counter()
        self.mem = MemTrace("client")  # LBBENCH_TRACEMALLOC: where a long run's memory goes
        self.mem.start()
        try:
            # the streams go through the one sender; health probes and /metrics scrapes through a plain session
            async with HttpBackend(model=self.model, clock=self.now, api=self.s.api, engine=self.engine,
                                   request_timeout_s=self.s.request_timeout_s) as backend, \
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)) as session:
                self.backend, self.session = backend, session
                self._start_kv_events()
                await self._warm_pool()
                if self.s.stream_workers:
                    self.workers = self._start_workers()
                if self.num_load_workers:
                    self.lw = self._start_load_workers()
                self.drive.start_clock(0.01 + self.lead_s)  # a little lead-in for the first arrival
                if self.workers is not None:
                    self.workers.start(self.loop, self.drive.t0, self._on_worker_item, self._crash)
                if self.lw is not None:
                    self.lw.start(self.loop, self.drive.t0, self._on_worker_item, self._worker_lost)
                tasks = [asyncio.create_task(self._schedule()), asyncio.create_task(self._watch())]
                if self.detector is not None:
                    tasks.append(asyncio.create_task(self._watch_saturation()))
                if self.s.scrape_interval_s:
                    tasks.append(asyncio.create_task(self._scrape()))
                for t in tasks:
                    t.add_done_callback(self._task_done)
                if not self.requests:
                    self.finished.set()
                waiters = [asyncio.create_task(self.finished.wait()), asyncio.create_task(self.stop.wait())]
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                self.drive.close()
                if self.kv_feed is not None:
                    await self.kv_feed.close()
                for t in [*tasks, *waiters, *self.in_flight]:
                    t.cancel()
                await asyncio.gather(*tasks, *waiters, *self.in_flight, return_exceptions=True)
                self.mem.dump()
        finally:
            if self.workers is not None:
                self.workers.close()
            if self.lw is not None:
                self.lw.close()
            self.log.close()
        if self.error is not None:
            raise self.error
        complete = self.interrupted is None and self.log.num_records == len(self.requests)
        metrics = pl.DataFrame(self.metric_rows, schema=METRICS_SCHEMA, orient="row")
        res = ReplayResult(log=self.log, metrics=metrics, complete=complete,
                           token_times=self.token_times, interrupted=self.interrupted,
                           duration_s=time.perf_counter() - wall0, endpoints=self.endpoints,
                           model=self.model, clock_origin_s=self.drive.t0, failure_times=self.failure_times)
        if self.kv_feed is not None:
            res.kv_events = self.kv_feed.summary()
        if self.detector is not None and self.detector.saturated:
            res.saturated_at_s, res.saturation_slope_per_s = self.detector.saturated_at_s, self.detector.slope_per_s
        if self.lw is not None:
            res.clock_offsets = [w.clock.offset_s for w in self.lw.info]
            sends = res.frame().select("load_worker", "actual_send_s", "planned_send_s").collect()
            res.load_workers = worker_summary(self.lw.info, sends, self.lw.clock_history)
        return res

    def _start_kv_events(self) -> None:
        """Subscribe to the instances' KV events for a router that reads them (token-id prompts only: a text
        prompt's blocks are unknown to the router and match nothing)."""
        if not self.s.kv_events or getattr(self.router, "bind_kv_events", None) is None:
            return
        from ..live.kv_events import KVEventFeed  # lazy: the live extra
        texts = self.s.prompt_texts or {}

        def tokens_of(r: Request) -> list[int] | None:
            if r.prompt is not None or r.request_id in texts:
                return None
            return prompt_token_ids(r)
        self.kv_feed = KVEventFeed(self.s.kv_events, self.now, tokens_of)
        self.kv_feed.bind(self.router)
        self.kv_feed.start()

    def _start_workers(self):
        settings = WorkerSettings(endpoints=tuple(self.endpoints), model=self.model, api=self.s.api,
                                  engine=self.engine.name, request_timeout_s=self.s.request_timeout_s,
                                  min_step_s=self.s.min_step_s,
                                  warm_connections=min(self.s.warm_connections, len(self.requests)))
        return StreamWorkers(self.s.stream_workers, settings)

    def _start_load_workers(self):
        settings = LoadWorkerSettings(endpoints=tuple(self.endpoints), model=self.model, api=self.s.api,
                                      engine=self.engine.name, request_timeout_s=self.s.request_timeout_s,
                                      min_step_s=self.s.min_step_s,
                                      warm_connections=min(self.s.warm_connections, len(self.requests)))
        return LoadWorkers(self.num_load_workers, settings, ray=self.s.ray)

    def _worker_lost(self, worker: int, held: list[int]) -> None:
        """A load worker's connection closed mid-run: stop, keep what finished, incomplete."""
        self.request_stop(f"load worker {worker} lost with {len(held)} request(s) in flight")

    def _on_worker_item(self, item: tuple) -> None:
        """A batch item from a stream worker: token events, or a request's whole result."""
        kind, rid, inst = item[0], item[1], item[2]
        if kind == "first":
            self.drive.observe(FirstToken(rid, inst, item[3]))
        elif kind == "tokens":
            self.drive.observe(TokensGenerated(rid, inst, item[3], item[4]))
        elif kind == "done":
            if rid not in self.remote:  # cancelled on saturation: already recorded
                return
            req, inst, dispatch_s, planned_s = self.remote.pop(rid)
            self._finish(req, inst, dispatch_s, planned_s, item[3])

    async def _warm_pool(self) -> None:
        """Open ``warm_connections`` keep-alive connections per endpoint before
        the clock starts, so the first burst does not pay for TCP connects."""
        await self.backend.warm(self.endpoints, min(self.s.warm_connections, len(self.requests)))

    def _crash(self, exc: BaseException) -> None:
        """Stop the run and make ``run`` raise ``exc`` (after keeping what finished)."""
        if self.error is None:
            self.error = exc
        self.stop.set()

    def _task_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._crash(task.exception())

    def request_stop(self, why: str) -> None:
        if self.interrupted is None:
            self.interrupted = why
        self.stop.set()

    # -- arrivals and decision epochs ------------------------------------------------------
    async def _schedule(self) -> None:
        reqs = self._stream
        i, n = 0, len(reqs)
        early_s = self.s.early_wake_s
        lead_s = self.lead_s  # load workers: decide this much ahead, the worker sends on time
        # with load workers this loop needs no sub-millisecond precision (the lead absorbs it): no yielding loop
        # before each arrival, and what is due within SLACK_S is decided now
        slack_s = SLACK_S if self.lw is not None else 0.0
        if self.lw is not None:
            early_s = 0.0
        while i < n and not self.stopped_sending:
            target = reqs[i].arrival_s - lead_s
            delay = target - self.now()
            if delay > early_s + slack_s:
                # the selector rounds its timeout up to a whole millisecond: wake a
                # little early and give the last fraction to other tasks instead
                await asyncio.sleep(delay - early_s)
            while self.now() < target - slack_s:
                await asyncio.sleep(0)
            if self.stopped_sending:
                return
            now = self.now()
            while i < n and reqs[i].arrival_s - lead_s <= now + slack_s:
                self.arrived_at[reqs[i].request_id] = now  # before: flow control may shed it at once
                self.drive.arrive(reqs[i])
                i += 1
                self._next_i = i
                self.num_arrived += 1
            self._epoch(now)

    def _arrive_turn(self, req: Request, due_s: float) -> None:
        """A session's next turn is due: it arrives now (its record's ``arrival_s``)."""
        now = self.now()
        if self.stopped_sending:
            self._record(req, -1, None, None, None, NOT_SENT)
            return
        if now < due_s:  # the event loop may fire a timer up to its clock resolution early
            self.loop.call_later(due_s - now, self._arrive_turn, req, due_s)
            return
        req = replace(req, arrival_s=now)
        self.no_lead.add(req.request_id)
        self.arrived_at[req.request_id] = now  # before: flow control may shed it at once
        self.drive.arrive(req)
        self.num_arrived += 1
        self._epoch(now)

    def _epoch(self, now: float) -> None:
        self.drive.epoch(now)  # a router bug (e.g. RouterError) goes to _crash and ends the run, loudly

    def _dispatched(self, req: Request, inst: int, now: float) -> None:
        held = now - self.arrived_at.pop(req.request_id, now)
        prio = self.s.priority_of(req, inst) if self.s.priority_of is not None else None
        text = (self.s.prompt_texts or {}).get(req.request_id)
        if self.lw is not None:
            lead = 0.0 if req.request_id in self.no_lead else self.lead_s
            self.no_lead.discard(req.request_id)
            planned = req.arrival_s + max(0.0, held - lead)  # what the router held it for, beyond the lead
            self.remote[req.request_id] = (req, inst, planned, planned)
            self.worker_rec[req.request_id] = self.lw.submit(req, inst, prio, text, planned)
            return
        if self.workers is not None:
            self.remote[req.request_id] = (req, inst, now, req.arrival_s + held)
            self.workers.submit(req, inst, prio, text)
            return
        decode = self.drive.dispatcher.decode_of.pop(req.request_id, None)  # a pair router's: prefilled on inst
        task = self.loop.create_task(self._send(req, inst, now, req.arrival_s + held, prio, text, decode))
        self.in_flight[task] = (req, inst if decode is None else decode, now, req.arrival_s + held)
        task.add_done_callback(self._send_done)

    def _shed(self, req: Request, status: int) -> None:
        """Flow control shed ``req`` (429 on arrival, 503 displaced): never sent, recorded now, as the simulator
        records it (``dispatch_s`` when it was shed, never before its arrival)."""
        self.arrived_at.pop(req.request_id, None)
        self.no_lead.discard(req.request_id)
        self._record(req, -1, max(self.now(), req.arrival_s), None, None, shed_message(status), http_status=status)

    def _send_done(self, task: asyncio.Task) -> None:
        self.in_flight.pop(task, None)
        self._task_done(task)

    # -- one request -------------------------------------------------------------------------
    async def _send(self, req: Request, inst: int, dispatch_s: float, planned_s: float, prio: int | None,
                    text: str | None, decode: int | None = None) -> None:
        if decode is None:
            res = await self.backend.send(self.endpoints[inst], req, self.drive.token_observer(req.request_id, inst),
                                          priority=prio, text=text)
            self._finish(req, inst, dispatch_s, planned_s, res)
            return
        # prefill/decode: to the decode instance, naming the prefill one (llm-d's sidecar protocol)
        legs = self.drive.pair_legs(req, inst, decode)
        res = await self.backend.send(self.endpoints[decode], req, legs.on_tokens, priority=prio, text=text,
                                      headers={PREFILLER_HEADER: host_port(self.endpoints[inst])})
        self._finish(req, decode, dispatch_s, planned_s, res, prefill=inst, state_instance=legs.instance)

    def _finish(self, req: Request, inst: int, dispatch_s: float, planned_s: float, res: StreamResult,
                prefill: int | None = None, state_instance: int | None = None) -> None:
        """``inst`` served it (a pair's decode instance, prefilled on ``prefill``); the state has it on
        ``state_instance`` (default ``inst``)."""
        rid, observe = req.request_id, self.drive.observe
        now = self.now()
        at = inst if state_instance is None else state_instance
        if res.error is None:
            observe(Finished(rid, at, res.finish_s if res.finish_s is not None else now,
                             res.generated_tokens))
        else:
            observe(Failed(rid, at, now, res.error))
            self.failure_times[rid] = now
            if res.connection_error:
                self.drive.mark_down(inst)
        self._record(req, inst, dispatch_s, planned_s, res, prefill=prefill)
        self._epoch(self.now())

    def _record(self, req: Request, inst: int, dispatch_s: float | None, planned_s: float | None,
                res: StreamResult | None, error: str | None = None, prefill: int | None = None,
                http_status: int | None = None) -> None:
        rec = RequestRecord.for_request(
            req, run_id=self.s.run_id, router=self.label, seed=self.s.seed, instance=inst, dispatch_s=dispatch_s,
            first_token_s=res.first_token_s if res else None, finish_s=res.finish_s if res else None,
            generated_tokens=res.generated_tokens if res else 0, token_times=res.token_times_s if res else None,
            planned_send_s=planned_s, actual_send_s=res.actual_send_s if res else None,
            server_prompt_tokens=res.server_prompt_tokens if res else None,
            server_output_tokens=res.server_output_tokens if res else None,
            http_status=res.http_status if res else http_status, error=res.error if res else error)
        if prefill is not None or (res is not None and res.pd_timing):  # a pair router's, or one behind a gateway's
            pd_record_fields(rec, prefill, res)
        nxt = self._next_turn.pop(req.request_id, None)
        if nxt is not None and self.stopped_sending:
            self._record(nxt, -1, None, None, None, NOT_SENT)  # the session's later turns will not be sent
        elif nxt is not None:
            now = self.now()
            done_s = res.finish_s if res is not None and res.finish_s is not None else now
            due = max(nxt.arrival_s, done_s + nxt.think_s)
            self.loop.call_later(max(0.0, due - now), self._arrive_turn, nxt, due)
        if res is not None and self.s.keep_token_times:
            self.token_times[req.request_id] = res.token_times_s
        w = self.worker_rec.pop(req.request_id, None)
        if w is not None:  # the JSON line also has the worker's offset now
            self.log.add(rec, w, clock_offset_s=self.lw.info[w].clock.offset_s)
        else:
            self.log.add(rec)
        done, total = self.log.num_records, len(self.requests)
        if self.s.progress is not None:
            now = self.now()
            if done == total or now - self._last_progress_s >= 0.1:
                self._last_progress_s = now
                self.s.progress(done, total)
        if done == total:
            self.finished.set()

    # -- saturation ------------------------------------------------------------------------
    async def _watch_saturation(self) -> None:
        """Sample the backlog (arrived, not yet ended) while requests are still to arrive; at the first saturated
        sample mark the run and, unless told only to mark, stop sending (``_stop_sending``)."""
        every = sample_interval(self.detector.window_s)
        total = len(self.requests)
        while True:
            await asyncio.sleep(every)
            if self.num_arrived >= total:
                return  # everything has arrived: nothing left to stop
            now = self.now()
            if self.detector.add(now, self.num_arrived - self.log.num_records):
                if self.s.saturation.stop:
                    self._stop_sending(now)
                return

    def _stop_sending(self, now: float) -> None:
        """Saturated: every request not yet sent gets its ``not sent`` record; with ``cancel`` the requests in
        flight are aborted and recorded as failed (``drain`` lets them finish)."""
        self.stopped_sending = True
        unsent = self._stream[self._next_i:]
        self._next_i = len(self._stream)
        for req in self.drive.drop_all():
            self.arrived_at.pop(req.request_id, None)
            self._record(req, -1, None, None, None, NOT_SENT)
        for req in unsent:
            self._record(req, -1, None, None, None, NOT_SENT)
        if self.s.saturation.on_saturation != "cancel":
            return
        for task, (req, inst, dispatch_s, planned_s) in list(self.in_flight.items()):
            if task.done():
                continue
            task.cancel()
            self._cancelled(req, inst, dispatch_s, planned_s, now)
        for rid, (req, inst, dispatch_s, planned_s) in list(self.remote.items()):
            del self.remote[rid]  # a worker's late result for it is dropped (``_on_worker_item``)
            self._cancelled(req, inst, dispatch_s, planned_s, now)

    def _cancelled(self, req: Request, inst: int, dispatch_s: float, planned_s: float, now: float) -> None:
        at = self.state.instance_of(req.request_id)  # a pair's prefill instance until its first token
        self.drive.observe(Failed(req.request_id, inst if at is None else at, now, CANCELLED))
        self.failure_times[req.request_id] = now
        self._record(req, inst, dispatch_s, planned_s, None, CANCELLED)

    # -- health, stalls, metrics ---------------------------------------------------------
    async def _probe(self, inst: int) -> bool | None:
        return await probe_health(self.session, self.endpoints[inst])

    async def _watch(self) -> None:
        """Bring instances back when ``/health`` answers; fail requests that can
        never be dispatched (every instance down, or the router deferring with
        nothing in flight) after ``stall_timeout_s``."""
        stalled_since: float | None = None
        while True:
            await asyncio.sleep(self.s.health_interval_s)
            self.mem.tick()
            down = [iv.index for iv in self.state.view().instances if not iv.healthy]
            if down:
                await self.drive.check_health(self._probe, down)
            stuck = self.drive.waiting > 0 and not self.in_flight and not self.remote and (
                self.num_arrived == len(self.requests) or not self.drive.healthy_indices())
            now = self.now()
            if not stuck:
                stalled_since = None
            elif stalled_since is None:
                stalled_since = now
            elif now - stalled_since >= self.s.stall_timeout_s:
                why = ("no healthy instance" if not self.drive.healthy_indices()
                       else f"router {self.router.name!r} kept deferring")
                self._fail_queue(now, f"not dispatched: {why} for {self.s.stall_timeout_s:g}s")
                stalled_since = None

    def _fail_queue(self, now: float, error: str) -> None:
        for req in self.drive.drop_all():
            self.arrived_at.pop(req.request_id, None)
            self._record(req, -1, now, None, None, error)

    async def _scrape(self) -> None:
        n = len(self.endpoints)
        while True:
            await asyncio.sleep(self.s.scrape_interval_s)
            texts = await asyncio.gather(*(self._fetch_metrics(i) for i in range(n)))
            for i, text in enumerate(texts):
                m = parse_metrics(text, self.engine) if text else None
                if m is None:
                    continue
                t = self.now()
                self.drive.observe(MetricsSample(i, t, m.num_running, m.num_waiting, m.kv_usage,
                                                      m.num_preemptions))
                self.metric_rows.append((t, i, m.num_running, m.num_waiting, m.kv_usage, m.num_preemptions))

    async def _fetch_metrics(self, inst: int) -> str | None:
        try:
            timeout = aiohttp.ClientTimeout(total=max(1.0, self.s.scrape_interval_s))
            async with self.session.get(self.endpoints[inst] + "/metrics", timeout=timeout) as resp:
                return await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None


def run_replay(requests: Sequence[Request], router: Router, endpoints: Sequence[str],
               settings: ReplaySettings) -> ReplayResult:
    """Replay ``requests`` against ``endpoints`` through ``router`` (blocking), as ``settings`` say.

    Every endpoint is checked first (``EndpointError`` if one does not answer). Ctrl-C / SIGTERM end the run
    early with ``complete=False`` (handled only when called from the main thread).
    """
    urls = check_endpoints(endpoints)
    specs = settings.specs if settings.specs is not None else [InstanceSpec() for _ in urls]
    if len(specs) != len(urls):
        raise ValueError(f"{len(specs)} instance specs for {len(urls)} endpoints")
    if settings.stream_workers and settings.load_workers:
        raise ValueError("load_workers: choose stream workers or load workers, not both")
    model = settings.model
    if model is None:
        try:
            models = served_models(urls[0])
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise EndpointError(f"endpoint {endpoints[0]}: cannot list models: {exc}") from None
        if not models:
            raise EndpointError(f"endpoint {endpoints[0]}: serves no model")
        model = models[0]
    replay = _Replay(requests, router, urls, model, specs, settings)
    loop = new_event_loop()
    in_main = threading.current_thread() is threading.main_thread()
    saved = {}
    try:
        if in_main:
            for sig in (signal.SIGINT, signal.SIGTERM):
                saved[sig] = signal.getsignal(sig)
                loop.add_signal_handler(sig, replay.request_stop, sig.name)
        with quiet_gc():
            return loop.run_until_complete(replay.run())
    finally:
        for sig, handler in saved.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def pd_record_fields(rec: RequestRecord, prefill: int | None, res: StreamResult | None) -> None:
    """A disaggregated request's record: its prefill instance (None: unknown, a gateway chose it) and, where its
    decode instance reported them
    (``StreamResult.pd_timing``), the simulator's TTFT split on the run's clock: the prefill leg ends
    ``prefill_s`` after the send, the KV is ready ``transfer_s`` later, admitted ``kv_wait_s`` after that."""
    rec.prefill_instance = prefill
    t = (res.pd_timing if res is not None else None) or {}
    if "transfer_s" in t:
        rec.transfer_bytes = t.get("transfer_bytes")
    if res is None or "prefill_s" not in t:
        return
    rec.prefill_done_s = res.actual_send_s + t["prefill_s"]
    if "transfer_s" in t:
        rec.kv_ready_s = rec.prefill_done_s + t["transfer_s"]
        rec.decode_admit_s = rec.kv_ready_s + t.get("kv_wait_s", 0.0)
