"""The central router queue and its decision epochs: a pure state machine.

Both the simulator (virtual time) and the live harness (asyncio, wall clock)
drive the *same* ``Dispatcher``: they call ``arrive`` when a request reaches the
load balancer and ``decide`` at every decision epoch (an arrival, a completion,
and every ``Δt`` while requests wait). ``decide`` offers the queue to the router
until it defers (returns ``None``) or the queue is empty, applies each
``Dispatched`` event to the shared ``ClusterState`` so the next decision in the
same epoch sees it, and returns the dispatches for the backend to carry out.

With flow control on (``admission=``, a ``lbbench.admission.FlowController``) an arriving request is held at
the gateway and released to the router's queue while the pool has room; what is over capacity is shed into
``shed`` as ``(request, http_status)``, which the backend turns into records (never dropped).

With a signal lag (``signal_lag_s`` > 0) the router sees the cluster as it was ``signal_lag_s`` ago: every event an
instance reports (first tokens, tokens, finishes, preemptions, health, metrics) reaches the router's view and its
``on_event`` hook that much later, as a scraped or published signal does; its own dispatches it sees at once. The
dispatcher's own state (flow control's room) stays current. With no lag nothing changes.

The dispatcher owns the router protocol (routers never import this module).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol, Sequence, runtime_checkable

from .admission import STATUS_EVICTED, STATUS_REJECTED, FlowController
from .core import ClusterState, ClusterView, Decision, Dispatched, Event, Request, prefill_leg
from .errors import InputError, SetupError


@runtime_checkable
class Router(Protocol):
    """What a router is, as the dispatcher uses it.

    ``route`` sees the queue (read-only, oldest first), an immutable view of
    the cluster and the time; it returns which queued request goes to which
    instance, or ``None`` to defer (nothing more is dispatched this epoch).
    Synchronous, no I/O, deterministic for a given seed.
    """

    name: str

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        ...
        # a prefill/decode router returns a ``PairDecision`` (``lbbench.core``): decode on ``instance`` after a
        # prefill on ``prefill`` (None: served whole on ``instance``)


class EpochGuard(Protocol):
    """An optional shortcut around a router's decisions (``Dispatcher.guard``): a driver that knows when its
    router would defer anyway (a planner's rollouts of a gate) spares the epoch, and with it the view."""

    def skip(self, now_s: float) -> bool:
        """True: this epoch decides nothing (the router is not offered the queue)."""
        ...

    def decided(self, now_s: float) -> None:
        """Called after every epoch the router was offered (its dispatches already taken off the queue)."""
        ...


class RouterError(SetupError):
    """A router returned a decision that cannot be carried out."""


class Dispatcher:
    """Central FIFO queue (arrival order) + decision epochs."""

    def __init__(self, router: Router, state: ClusterState, max_per_epoch: int | None = None,
                 admission: FlowController | None = None, signal_lag_s: float = 0.0):
        if not signal_lag_s >= 0:
            raise InputError(f"{signal_lag_s:g} must be >= 0 seconds", "signal_lag_s")
        self.state = state
        #: how late the router sees what the instances report (0: at once)
        self.signal_lag_s = signal_lag_s
        #: with a lag, the router's view: ``state`` as of ``signal_lag_s`` ago, and the events still on their way
        self.router_state: ClusterState | None = state.replica() if signal_lag_s > 0 else None
        self._delayed: deque[Event] = deque()
        #: flow control (None: every arrival joins the router's queue)
        self.admission = admission
        #: requests shed by flow control, ``(request, http_status)``, for the backend to record and clear
        self.shed: list[tuple[Request, int]] = []
        self.max_per_epoch = max_per_epoch
        self._queue: list[Request] = []
        self.set_router(router)
        #: consulted around every epoch when set (``EpochGuard``)
        self.guard: EpochGuard | None = None
        self.num_decisions = 0
        self.num_deferrals = 0
        #: the dispatches decided so far in the epoch in progress (the backend sends them when it ends)
        self.decided: list[tuple[Request, int]] = []
        #: request id -> its decode instance, for requests sent to a prefill instance (``dispatch_pair``)
        self.decode_of: dict[int, int] = {}

    def set_router(self, router: Router) -> None:
        """Decide with ``router`` from now on: its hooks (``needs_detail``, ``on_event``) replace the old one's;
        the queue and the state are kept."""
        self.router = router
        self._detail = bool(getattr(router, "needs_detail", False))
        self._router_on_event = getattr(router, "on_event", None)
        # with a lag every event takes the delaying hook (and the simulator's paths that skip the hook are off)
        self._on_event = self._delay if self.router_state is not None else self._router_on_event

    @property
    def queue(self) -> Sequence[Request]:
        """The requests waiting at the router, oldest first (read-only)."""
        return self._queue

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def waiting(self) -> int:
        """Requests waiting at the router or held by flow control."""
        adm = self.admission
        return len(self._queue) + (adm.num_held if adm is not None else 0)

    def arrive(self, request: Request) -> None:
        adm = self.admission
        if adm is None:
            self._queue.append(request)
            return
        adm.hold(request)
        self._release()
        for r in adm.shed():
            if r is request:
                adm.num_rejected += 1
                self.shed.append((r, STATUS_REJECTED))
            else:
                adm.num_evicted += 1
                self.shed.append((r, STATUS_EVICTED))

    def _release(self) -> None:
        """Move the held requests the pool has room for to the router's queue."""
        adm = self.admission
        n = adm.room(self.state.view(), len(self._queue))  # type: ignore[union-attr]
        if n > 0:
            self._queue.extend(adm.release(n))  # type: ignore[union-attr]

    def drop(self, queue_index: int) -> Request:
        """Remove a queued request without dispatching it (e.g. it can never be served)."""
        return self._queue.pop(queue_index)

    def observe(self, event: Event) -> None:
        """Feed a lifecycle event from the backend to the state and the router."""
        self.state.apply(event)
        if self._on_event is not None:
            self._on_event(event)

    def view(self, now_s: float | None = None) -> ClusterView:
        """What the router sees: the state now, or with a signal lag as of ``now_s - signal_lag_s`` (its own
        dispatches included)."""
        rs = self.router_state
        if rs is None:
            return self.state.view(detail=self._detail)
        self._catch_up(self.state.now_s if now_s is None else now_s)
        return rs.view(detail=self._detail)

    def _delay(self, event: Event) -> None:
        """With a lag: the router's own dispatch reaches its view at once, anything else ``signal_lag_s`` later."""
        if type(event) is Dispatched:
            self.router_state.apply(event)  # type: ignore[union-attr]
            if self._router_on_event is not None:
                self._router_on_event(event)
        else:
            self._delayed.append(event)

    def _catch_up(self, now_s: float) -> None:
        """Deliver the delayed events reported up to ``now_s - signal_lag_s``, in order."""
        due = now_s - self.signal_lag_s
        delayed, apply, hook = self._delayed, self.router_state.apply, self._router_on_event  # type: ignore[union-attr]
        while delayed and delayed[0].time_s <= due:
            ev = delayed.popleft()
            apply(ev)
            if hook is not None:
                hook(ev)

    def decide(self, now_s: float) -> list[tuple[Request, int]]:
        """Run one decision epoch; returns ``(request, instance)`` dispatches."""
        out: list[tuple[Request, int]] = []
        self.decided = out
        guard = self.guard
        if guard is not None and guard.skip(now_s):
            return out
        if self.admission is not None and self.admission.num_held:
            self._release()
        queue = self._queue
        n_inst = self.state.num_instances
        while queue and (self.max_per_epoch is None or len(out) < self.max_per_epoch):
            self.state.now_s = max(self.state.now_s, now_s)
            decision = self.router.route(queue, self.view(now_s), now_s)
            self.num_decisions += 1
            if decision is None:
                self.num_deferrals += 1
                break
            qi, inst = decision[0], decision[1]
            prefill = decision[2] if len(decision) > 2 else None  # a PairDecision: prefilled elsewhere first
            if (not (0 <= qi < len(queue)) or not (0 <= inst < n_inst)
                    or not (prefill is None or 0 <= prefill < n_inst)):
                raise RouterError(f"router {self.router.name!r} returned invalid decision {decision!r} "
                                  f"(queue length {len(queue)}, {n_inst} instances)")
            if prefill is None:
                out.append((self.dispatch(qi, inst, now_s), inst))
            else:
                out.append((self.dispatch_pair(qi, inst, prefill, now_s), prefill))
        if guard is not None:
            guard.decided(now_s)
        return out

    def dispatch(self, queue_index: int, instance: int, now_s: float) -> Request:
        """Take ``queue[queue_index]`` off the queue and record it as sent to ``instance``
        (what ``decide`` does per decision; step-wise drivers call it directly)."""
        req = self._queue.pop(queue_index)
        self.observe(Dispatched(req, instance, now_s))
        return req

    def dispatch_pair(self, queue_index: int, decode: int, prefill: int, now_s: float) -> Request:
        """Take ``queue[queue_index]`` off the queue to be prefilled on ``prefill`` (the state sees its prefill
        leg there, ``prefill_leg``) and decoded on ``decode`` (kept in ``decode_of`` for the backend, which
        sends the request to ``prefill``)."""
        req = self._queue.pop(queue_index)
        self.decode_of[req.request_id] = decode
        self.observe(Dispatched(prefill_leg(req), prefill, now_s))
        return req
