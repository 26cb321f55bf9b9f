"""The live decision loop, shared by the replay harness and the proxy.

A ``Drive`` holds one ``Dispatcher`` and one ``ClusterState`` — the very objects the simulator drives in
virtual time — and runs them on the wall clock inside an asyncio loop:

- **Decision epochs** are the simulator's: ``epoch()`` after an arrival or a completion, and every
  ``min_step_s`` while requests wait at the router (after it deferred). Each dispatch goes to ``on_dispatch``
  (the replay sends the request; the proxy wakes the waiting handler).
- **Lifecycle events** reach the state through ``observe``; ``token_observer`` turns a stream's chunks into
  ``FirstToken`` and at most one ``TokensGenerated`` per ``min_step_s``.
- **Pairs**: a pair router's request is sent to its decode instance with its prefill instance named (llm-d's
  protocol, ``lbbench.engines.vllm.pd``); ``PairLegs`` moves it on the state from its prefill leg to its decode
  instance at its first token, as the simulator does when its KV leaves.
- **Health**: ``check_health`` probes instances (``probe_health``: ``GET /health``) and feeds
  ``InstanceHealth`` changes; ``mark_down`` takes an instance out at once after a connection error.

The clock is ``time.monotonic()`` from ``start_clock``, not the loop's clock: uvloop's counts whole
milliseconds, which would round every send and token time of a replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from typing import Awaitable, Callable, Iterable, Iterator, Sequence

import aiohttp

from ..admission import AdmissionSpec, FlowController
from ..core import (ClusterState, Dispatched, Finished, FirstToken, InstanceHealth, InstanceSpec, Request,
                    TokensGenerated)
from ..dispatch import Dispatcher, Router
from .http import throttled

DispatchFn = Callable[[Request, int, float], None]

#: young-generation threshold while a replay runs (Python's default is 700 allocations)
QUIET_GC_THRESHOLD = (20_000, 50, 1000)


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Keep the cyclic garbage collector from pausing the event loop mid-run.

    Measured on the 80 req/s replay (``bench/bench_client_lag.py``): full collections over a heap of streams in
    flight stopped the loop for 35-80 ms, the largest dispatch lags of the run. Here every object that exists
    before the run is frozen (never scanned again until it ends) and the young generations are collected less
    often; the previous settings come back afterwards.
    """
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*QUIET_GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


#: consecutive unanswered health probes that take a backend down (a refused connection or an error status takes it
#: down at once): on an overloaded host a live backend can miss one 2-second probe, and taking every backend down
#: for it failed requests no backend had failed (the proxy's 30-minute overload soak: 854 of 144,000)
SLOW_PROBES_DOWN = 3


async def probe_health(session: aiohttp.ClientSession, url: str, timeout_s: float = 2.0) -> bool | None:
    """True when ``url/health`` answers 200 within ``timeout_s``; False when it refuses the connection or answers
    another status; None when it does not answer in time (slow or dead: ``Drive.check_health`` decides)."""
    try:
        async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return resp.status == 200
    except asyncio.TimeoutError:
        return None
    except aiohttp.ClientError:
        return False


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (less per-event overhead for the many streamed chunks of a
    replay), else asyncio's."""
    try:
        import uvloop  # lazy: uvloop is not installed on Windows
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Drive:
    def __init__(self, router: Router, specs: Sequence[InstanceSpec], *, min_step_s: float,
                 on_dispatch: DispatchFn, on_error: Callable[[BaseException], None] | None = None,
                 admission: AdmissionSpec | None = None, on_shed: Callable[[Request, int], None] | None = None,
                 signal_lag_s: float = 0.0):
        self.state = ClusterState(list(specs))
        self.dispatcher = Dispatcher(router, self.state, admission=None if admission is None else FlowController(
            admission, list(specs)), signal_lag_s=signal_lag_s)
        #: flow control shed a request: ``on_shed(request, http_status)`` (429 on arrival, 503 displaced)
        self.on_shed = on_shed
        self.min_step_s = min_step_s
        self.on_dispatch = on_dispatch
        self.on_error = on_error
        self.t0 = time.monotonic()
        self._tick: asyncio.TimerHandle | None = None
        self._unanswered: dict[int, int] = {}  # instance -> health probes unanswered in a row

    # -- clock ---------------------------------------------------------------------------------
    def start_clock(self, lead_s: float = 0.0) -> None:
        """Time zero is ``lead_s`` from now."""
        self.t0 = time.monotonic() + lead_s

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- decisions -----------------------------------------------------------------------------
    def arrive(self, req: Request) -> None:
        disp = self.dispatcher
        disp.arrive(req)
        if disp.shed:
            shed, disp.shed = disp.shed, []
            for r, status in shed:
                if self.on_shed is not None:
                    self.on_shed(r, status)

    def __len__(self) -> int:
        """Requests waiting at the router."""
        return len(self.dispatcher)

    @property
    def waiting(self) -> int:
        """Requests waiting at the router or held by flow control."""
        return self.dispatcher.waiting

    def epoch(self, now: float | None = None) -> None:
        """A decision epoch: dispatch what the router decides now; tick again while requests wait.

        A router error goes to ``on_error`` when one is set (an epoch run from a timer has no caller to raise
        to), else it is raised."""
        now = self.now() if now is None else now
        try:
            dispatches = self.dispatcher.decide(now)
        except Exception as exc:
            if self.on_error is None:
                raise
            self.on_error(exc)
            return
        for req, inst in dispatches:
            self.on_dispatch(req, inst, now)
        if len(self.dispatcher) and self._tick is None:
            self._tick = asyncio.get_running_loop().call_later(self.min_step_s, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        if len(self.dispatcher):
            self.epoch()

    def withdraw(self, request_id: int) -> Request | None:
        """Take a request that is still waiting at the router, or held by flow control, out of the queue (its
        client went away)."""
        adm = self.dispatcher.admission
        if adm is not None:
            held = adm.withdraw(request_id)
            if held is not None:
                return held
        for i, q in enumerate(self.dispatcher.queue):
            if q.request_id == request_id:
                return self.dispatcher.drop(i)
        return None

    def drop_all(self) -> list[Request]:
        """Empty the router's queue and flow control's held requests (requests that can never be dispatched)."""
        out = []
        while len(self.dispatcher):
            out.append(self.dispatcher.drop(0))
        adm = self.dispatcher.admission
        if adm is not None:
            out += adm.release(adm.num_held)
        return out

    def close(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None

    # -- events --------------------------------------------------------------------------------
    def observe(self, event: object) -> None:
        self.dispatcher.observe(event)

    def token_observer(self, request_id: int, inst: int) -> Callable[[int, float], None]:
        """``(tokens so far, time)`` per stream chunk -> ``FirstToken``, then ``TokensGenerated`` at most once
        per ``min_step_s`` (what the simulator's state sees per engine step)."""
        observe = self.dispatcher.observe
        return throttled(self.min_step_s, lambda t: observe(FirstToken(request_id, inst, t)),
                         lambda t, count: observe(TokensGenerated(request_id, inst, t, count)))

    def pair_legs(self, request: Request, prefill: int, decode: int) -> "PairLegs":
        return PairLegs(self, request, prefill, decode)

    # -- health --------------------------------------------------------------------------------
    def healthy(self, inst: int) -> bool:
        return self.state.view().instances[inst].healthy

    def healthy_indices(self) -> list[int]:
        return list(self.state.view().healthy_indices())

    def mark_down(self, inst: int) -> bool:
        """Take ``inst`` out after a connection error; True when it was up."""
        if not self.healthy(inst):
            return False
        self.observe(InstanceHealth(inst, self.now(), False))
        return True

    async def check_health(self, probe: Callable[[int], Awaitable[bool | None]], indices: Iterable[int]
                           ) -> list[bool]:
        """Probe ``indices``, feed every change of health to the state, and run an epoch when one came back; an
        unanswered probe (None) takes an instance down only at the ``SLOW_PROBES_DOWN``-th in a row. Returns each
        instance's health after the probe."""
        idx = list(indices)
        answers = await asyncio.gather(*(probe(i) for i in idx))
        came_back = False
        view = self.state.view()
        ok = []
        for i, answer in zip(idx, answers):
            if answer is None:
                self._unanswered[i] = misses = self._unanswered.get(i, 0) + 1
                good = view.instances[i].healthy and misses < SLOW_PROBES_DOWN
            else:
                self._unanswered.pop(i, None)
                good = answer
            ok.append(good)
            if good != view.instances[i].healthy:
                self.observe(InstanceHealth(i, self.now(), good))
                came_back = came_back or good
        if came_back:
            self.epoch()
        return ok


class PairLegs:
    """A disaggregated request on the live state: its prefill leg on ``prefill`` (the dispatcher's
    ``dispatch_pair``) until the first token reaches the client, when the leg ends there and the request is
    dispatched on ``decode``; ``instance`` is where the state has it now (what a failure names)."""

    def __init__(self, drive: Drive, request: Request, prefill: int, decode: int):
        self.instance = prefill
        self._drive, self._request, self._decode = drive, request, decode
        self._tokens = drive.token_observer(request.request_id, decode)

    def on_tokens(self, count: int, time_s: float) -> None:
        if self.instance != self._decode:
            rid, observe = self._request.request_id, self._drive.observe
            observe(Finished(rid, self.instance, time_s, 1))  # the prefill leg's one token
            observe(Dispatched(self._request, self._decode, time_s))
            self.instance = self._decode
        self._tokens(count, time_s)
