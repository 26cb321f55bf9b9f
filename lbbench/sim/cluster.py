"""The simulated cluster: N ``SimInstance``s, the shared dispatcher, virtual time.

An event queue keyed by ``(time_s, priority, seq)`` with a per-simulator counter
(never creation order or global counters). At equal times instance wake-ups
(completions) come first, then arrivals, then the dispatcher's Δt timer, then
timeline samples. Decision epochs: every arrival, every completion while the
router queue is non-empty, and every ``Δt`` (the smallest ``min_step_s`` of the
instances' profiles) while requests wait after the router deferred.

A fleet: every instance owns its profile (``profiles=``, ``for_fleet``); a uniform
fleet is ``ClusterSim(profile, n, requests)``.

Three ways to drive it:

- ``run(router)`` — batch: replays every request and returns the records;
- step-wise (the Gymnasium environment): ``advance(until_s)`` processes events up
  to a time without routing (arrivals wait in ``queue``), ``dispatch(i, inst)``
  routes ``queue[i]`` through the same dispatcher code path;
- rollouts (planner, teachers, counterfactuals): ``clone()`` a simulator,
  ``set_router`` on the copy, ``send`` any dispatches decided by hand,
  ``run_until(t_s)``, then read ``records`` and ``pending_work()``. Event kinds
  are named by ``SimEvent``.

One event loop (``_run_events``) serves all three: ``run`` runs it to the end, ``run_until`` and ``advance`` to
a time (routing at every epoch, or leaving arrivals in ``queue``). Instance wake-ups, most of the events, are
handled inline in it (the instance's ``advance`` and ``_reschedule``, marked); ``bench/sim_golden.py`` pins
its records.

The public face, besides the methods above (``view``, ``next_event_s``, ``arm_timer``, ``timer_pending``,
``subscribe_kv_events``, ``done``, ``num_instances``, ``next_arrival_s``, ``queue``): these attributes, read by
the planner, the teachers, the RL environment and the decision traces. Read them; change the simulator only
through its methods (a router is set with ``set_router``).

- ``records``: the ``RequestRecord`` of every request done so far, in completion order;
- ``requests``: the workload (first turns of sessions), in arrival order; ``profiles``: one per instance
  (``profile`` is the first);
- ``dispatcher``: the ``lbbench.dispatch.Dispatcher`` the simulator drives: its ``queue``, the dispatches
  ``decided`` in the epoch in progress, its ``guard`` (an ``EpochGuard`` a planner may set on a fork), and
  ``decide`` / ``dispatch`` for an epoch decided outside the loop (then ``send``);
- ``state``: the client-side ``ClusterState`` the lifecycle events feed (``view`` reads it);
- ``instances``: the ``SimInstance``s (their counters, and ``kv``, each one's block manager);
- ``timeline`` (the samples), ``completions_log`` (``(finish time, request id)``), ``now_s``,
  ``num_completed``.

Flow control (``admission=``, ``lbbench.admission``): arrivals are held at the gateway and released to the
router as the pool has room; a request shed there (429 on arrival, 503 displaced) is recorded at once with its
``http_status`` and ``error`` and no instance (``instance = -1``).

A signal lag (``signal_lag_s``): the router sees the instances as they were that long ago (``Dispatcher``).

Multi-turn sessions run closed loop: a turn after a session's first arrives when
the previous turn has finished (as the client sees it) plus its ``think_s``, or
at its own ``arrival_s`` if that is later.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from enum import IntEnum
from typing import Callable, Iterable, NamedTuple, Sequence

from ..admission import AdmissionSpec, FlowController, shed_message
from ..core import (ClusterState, ClusterView, Decision, Event, Failed, Finished, FirstToken, InstanceSpec,
                    MetricsSample, Request, RequestRecord, StepsAdvanced, chain_sessions)
from ..dispatch import Dispatcher, Router
from ..profiles import Profile
from .instance import SimInstance, SimRequest
from .kv_events import KVCacheEvent


class SimEvent(IntEnum):
    """Kinds of the event queue, in their order at equal times."""

    WAKE = 0
    """An instance's segment in progress ends (completions, first tokens)."""
    ARRIVAL = 1
    """A session's next turn reaches the router (first turns come from the request list)."""
    TIMER = 2
    """The dispatcher's Δt re-offer of the queue while requests wait after the router deferred."""
    SAMPLE = 3
    """A timeline sample."""
    TRANSFER = 4
    """A KV transfer between a prefill and a decode instance starts or lands (``lbbench.sim.disagg``)."""


# the event loop compares plain ints (the same values as ``SimEvent``)
_WAKE, _ARRIVAL, _TIMER, _SAMPLE, _TRANSFER = (int(k) for k in SimEvent)
_INF = float("inf")


class PendingWork(NamedTuple):
    """One request in the system and how far it got (``ClusterSim.pending_work``)."""

    instance: int | None
    """The instance serving it; None while it waits at the router."""
    request: Request
    computed_tokens: int
    """Tokens whose KV is computed (prompt and generated; 0 again after a preemption by recompute)."""
    generated_tokens: int


class _Hold:
    """Placeholder router for step-wise driving: always defers."""

    name = "external"

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        return None


class ClusterSim:
    """The simulated cluster. ``ClusterSim(profile, n, requests)``: ``n`` instances of one profile (a uniform
    fleet). ``profiles=``: one profile per instance (a mixed fleet, e.g. ``Fleet.profiles()``; ``profile``
    is then None or the first of them and ``num_instances`` their number), or ``ClusterSim.for_fleet``.

    Each instance runs its own profile: step model, KV capacity and engine settings (chunked prefill,
    ``max_num_seqs``, scheduler V0/V1, prefix caching), except that ``chunked_prefill=`` and
    ``prefix_caching=`` override every instance when given. The client sees an instance's times later by its
    own profile's ``api_overhead_s``; the dispatcher's Δt is the smallest ``min_step_s`` of the fleet.
    ``profile`` is the first instance's profile (kept for callers of one profile), ``profiles`` every one.
    """

    def __init__(self, profile: Profile | None, num_instances: int, requests: Sequence[Request], *,
                 instance_scheduler: str = "fcfs", chunked_prefill: bool | None = None,
                 seed: int = 0, run_id: str = "", check_invariants: bool = False, skip_ahead: bool = True,
                 timeline_interval_s: float | None = None,
                 prompt_buckets: tuple[int, ...] | None = None,
                 decode_buckets: tuple[int, ...] | None = None,
                 prefix_caching: bool | None = None,
                 profiles: Sequence[Profile] | None = None, admission: AdmissionSpec | None = None,
                 signal_lag_s: float = 0.0, roles: Sequence[str] | None = None):
        if num_instances < 1:
            raise ValueError("instances must be >= 1")
        if profiles is None:
            if profile is None:
                raise ValueError("ClusterSim: give a profile or profiles=")
            profiles = [profile] * num_instances
        else:
            profiles = list(profiles)
            if len(profiles) != num_instances:
                raise ValueError(f"ClusterSim: {len(profiles)} profiles for {num_instances} instances")
            if profile is not None and profile != profiles[0]:
                raise ValueError("ClusterSim: profile must be None or the first of profiles=")
        self.profile = profiles[0]
        self.profiles: list[Profile] = profiles
        self.seed = seed
        self.run_id = run_id
        self.instances = [SimInstance(p, i, instance_scheduler, chunked_prefill, check_invariants,
                                      skip_ahead, prefix_caching) for i, p in enumerate(profiles)]
        for inst in self.instances:
            inst._on_finish = self._make_finish_hook(inst)
        #: the dispatcher's Δt: the fleet's shortest minimum step
        self.dt_s = min(p.min_step_s for p in profiles)
        kw = {}
        if prompt_buckets is not None:
            kw["prompt_buckets"] = prompt_buckets
        if decode_buckets is not None:
            kw["decode_buckets"] = decode_buckets
        specs: dict[int, InstanceSpec] = {}  # one spec per distinct profile object
        for p in profiles:
            if id(p) not in specs:
                specs[id(p)] = p.instance_spec()
        inst_specs = [specs[id(p)] for p in profiles]
        if roles is not None:  # prefill/decode roles: what the routers see (``lbbench.sim.disagg`` runs them)
            inst_specs = [s if role == "mixed" else replace(s, role=role) for s, role in zip(inst_specs, roles)]
        self.state = ClusterState(inst_specs, **kw)
        self.num_requests = len(requests)
        # closed-loop sessions: later turns wait for the turn before them (``_next_turn``)
        self.requests, self._next_turn = chain_sessions(requests)
        self.router_name = ""
        self.records: list[RequestRecord] = []
        self.timeline: list[MetricsSample] = []
        self.timeline_interval_s = timeline_interval_s
        self.now_s = 0.0
        self.num_completed = 0  # finished + failed
        self.completions_log: list[tuple[float, int]] = []  # (time, request_id) of finishes
        self._heap: list[tuple[float, int, int, int, object]] = []
        self._seq = 0
        self._next_arrival = 0
        self._wake_version = [0] * num_instances
        self._dispatch_s: dict[int, float] = {}
        self._timer_pending = False
        self._auto = True
        self._progress: Callable[[int, int], None] | None = None
        self.dispatcher = Dispatcher(_Hold(), self.state, admission=None if admission is None else FlowController(
            admission, [specs[id(p)] for p in profiles]), signal_lag_s=signal_lag_s)
        if timeline_interval_s:
            self._push(0.0, _SAMPLE, None)

    # ------------------------------------------------------------------ plumbing
    def _push(self, t: float, kind: int, data: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, kind, data))

    def _make_finish_hook(self, inst: SimInstance) -> Callable[[SimRequest], None]:
        def hook(r: SimRequest) -> None:
            self._record(inst, r, None)
        return hook

    def _record(self, inst: SimInstance, r: SimRequest, error: str | None) -> None:
        req = r.request
        gen = r.generated if error is None else 0
        # the client sees the engine's times later by its front end's latency (0 unless measured)
        lag = inst.profile.api_overhead_s
        times = inst.token_times(r) if error is None and r.output_tokens > 1 else None
        self.records.append(RequestRecord.for_request(
            req, run_id=self.run_id, router=self.router_name, seed=self.seed, instance=inst.index,
            dispatch_s=self._dispatch_s[req.request_id],
            first_token_s=r.first_token_s + lag if r.first_token_s is not None else None,
            finish_s=r.finish_s + lag if error is None else None, generated_tokens=gen, token_times=times,
            num_preemptions=r.num_preemptions, error=error,
            cached_prompt_tokens=r.cached_tokens if error is None else None))
        self.num_completed += 1
        if error is None:
            self.completions_log.append((r.finish_s, req.request_id))
        nxt = self._next_turn.pop(req.request_id, None)
        if nxt is not None:  # the session's next turn: after this answer (as the client saw it) + think time
            done_s = (r.finish_s + lag) if error is None else self.now_s
            self._push(max(nxt.arrival_s, done_s + nxt.think_s), _ARRIVAL, nxt)
        if self._progress is not None:
            self._progress(self.num_completed, self.num_requests)

    def _arrive(self, req: Request) -> None:
        """``req`` reaches the gateway: into the router's queue, or held and perhaps shed (flow control)."""
        disp = self.dispatcher
        disp.arrive(req)
        if disp.shed:
            for r, status in disp.shed:
                self._record_shed(r, status)
            disp.shed.clear()
        self._epoch()

    def _record_shed(self, req: Request, status: int) -> None:
        """The record of a request flow control shed now: no instance, its status and why."""
        self.records.append(RequestRecord.for_request(
            req, run_id=self.run_id, router=self.router_name, seed=self.seed, instance=-1, dispatch_s=self.now_s,
            first_token_s=None, finish_s=None, generated_tokens=0, http_status=status,
            error=shed_message(status)))
        self.num_completed += 1
        nxt = self._next_turn.pop(req.request_id, None)
        if nxt is not None:  # the session goes on after the refusal, as after a failure
            self._push(max(nxt.arrival_s, self.now_s + nxt.think_s), _ARRIVAL, nxt)
        if self._progress is not None:
            self._progress(self.num_completed, self.num_requests)

    def _observe(self, events: list[Event]) -> int:
        """Apply instance events to the dispatcher; returns the number of completions."""
        if not events:
            return 0
        done = 0
        disp = self.dispatcher
        # the dispatcher's observe is the state's apply plus the router's event hook: without a hook, apply directly
        obs = disp.state.apply if disp._on_event is None and type(disp) is Dispatcher else disp.observe
        for ev in events:
            obs(ev)
            cls = type(ev)
            if cls is StepsAdvanced or cls is FirstToken:
                continue
            if isinstance(ev, Finished):
                done += 1
            elif isinstance(ev, Failed):
                done += 1
                inst = self.instances[ev.instance]
                self._record(inst, inst.rejected.pop(ev.request_id), ev.error)
        return done

    def _reschedule(self, i: int) -> None:
        self._wake_version[i] += 1
        t = self.instances[i].next_event_s()
        if t is not None:
            self._push(t, _WAKE, (i, self._wake_version[i]))

    @classmethod
    def for_fleet(cls, fleet, requests: Sequence[Request], **kw) -> "ClusterSim":
        """A simulator of a ``lbbench.fleet.Fleet`` (one profile per instance, ``fleet.profiles()``)."""
        profiles = fleet.profiles()
        return cls(None, len(profiles), requests, profiles=profiles, **kw)

    @property
    def next_arrival_s(self) -> float:
        """Arrival time of the next request not yet at the router (inf when none is left)."""
        na = self._next_arrival
        return self.requests[na].arrival_s if na < len(self.requests) else float("inf")

    @property
    def done(self) -> bool:
        return self.num_completed >= self.num_requests

    @property
    def queue(self) -> Sequence[Request]:
        return self.dispatcher.queue

    def view(self, detail: bool | None = None) -> ClusterView:
        """The cluster as a client sees it now (``state.view``); ``detail``: with per-request entries (default:
        as the router in charge asks, ``needs_detail``)."""
        return self.dispatcher.view() if detail is None else self.state.view(detail=detail)

    def clone(self) -> "ClusterSim":
        """An independent copy at the current time (``lbbench.sim.fork``): instance states, event queue,
        dispatcher queue, cluster state and counters are copied; profiles and requests are shared."""
        from .fork import fork  # lazy: a cycle (fork imports this module)
        return fork(self)

    @property
    def num_instances(self) -> int:
        return len(self.instances)

    def pending_work(self) -> list[PendingWork]:
        """Every request in the system now: those on an instance (running, waiting there) in instance order,
        then those at the router, oldest first."""
        rows = []
        for inst in self.instances:
            i, clock = inst.index, inst.clock
            for r in inst.reqs.values():
                if r.decoding:  # its counts follow the instance's step clock
                    rows.append(PendingWork(i, r.request, r.key + clock, r.g0 + clock - r.c0))
                else:
                    rows.append(PendingWork(i, r.request, r.num_computed, r.generated))
        rows.extend(PendingWork(None, r, 0, 0) for r in self.dispatcher.queue)
        return rows

    def cached_prompt_tokens(self, instance: int, request: Request) -> int:
        """The prompt tokens of ``request`` that ``instance``'s prefix cache holds now (``KVBlockManager.
        num_cached_prompt_tokens``; on the instance already, its own block keys): what admitting it there would
        reuse. Reads only."""
        inst = self.instances[instance]
        r = inst.reqs.get(request.request_id)
        return inst.kv.num_cached_prompt_tokens(request, r.keys if r is not None else None)

    def subscribe_kv_events(self, callback: Callable[[int, float, KVCacheEvent], None]) -> None:
        """Call ``callback(instance, time_s, event)`` for every KV cache event of every instance from now on
        (``lbbench.sim.kv_events``: blocks stored in or evicted from an instance's prefix cache, as vLLM
        publishes them); ``time_s`` is the instance's last step boundary. The hook through which a router
        will see the instances' caches, possibly late; a clone does not inherit subscribers."""
        for inst in self.instances:
            inst.kv.subscribe(lambda ev, inst=inst: callback(inst.index, inst.now_s, ev))

    # ------------------------------------------------------------------ routing
    def set_router(self, router: Router, label: str | None = None) -> None:
        """Route with ``router`` from now on (the queue and the cluster state are kept); a router with
        ``bind_simulator`` is bound to this simulator. ``label``: the ``router`` column of the records still to
        come (default: unchanged)."""
        self.dispatcher.set_router(router)
        bind = getattr(router, "bind_simulator", None)
        if bind is not None:
            bind(self)
        bind_kv = getattr(router, "bind_kv_events", None)
        if bind_kv is not None:  # a precise prefix router reads the instances' KV events
            bind_kv(self.subscribe_kv_events)
        if label is not None:
            self.router_name = label

    def dispatch(self, queue_index: int, instance: int) -> None:
        """Route ``queue[queue_index]`` to ``instance`` now (step-wise driving)."""
        self._send(self.dispatcher.dispatch(queue_index, instance, self.now_s), instance)

    def _send(self, req: Request, i: int) -> None:
        self._dispatch_s[req.request_id] = self.now_s
        self._observe(self.instances[i].add(req, self.now_s))
        self._reschedule(i)

    def send(self, dispatches: Iterable[tuple[Request, int]]) -> None:
        """Carry out ``(request, instance)`` dispatches the dispatcher already took off the queue
        (``Dispatcher.decide`` or ``Dispatcher.dispatch``), then arm the Δt timer while requests still wait:
        the end of a decision epoch decided outside the event loop."""
        for req, i in dispatches:
            self._send(req, i)
        if len(self.dispatcher):
            self.arm_timer()

    def arm_timer(self) -> bool:
        """Schedule the dispatcher's next offer of the queue (``SimEvent.TIMER``) one ``Δt`` (``dt_s``: the
        fleet's smallest ``min_step_s``) from now, unless one is pending; returns whether it was scheduled."""
        if self._timer_pending:
            return False
        self._timer_pending = True
        self._push(self.now_s + self.dt_s, _TIMER, None)
        return True

    @property
    def timer_pending(self) -> bool:
        """Whether a ``SimEvent.TIMER`` is scheduled and not yet processed."""
        return self._timer_pending

    def _epoch(self) -> None:
        if not self._auto or not self.dispatcher.waiting:
            return
        self.send(self.dispatcher.decide(self.now_s))

    # ------------------------------------------------------------------ the event loop
    def _run_events(self, until_s: float) -> None:
        """The event loop, the only one: process events in order (``SimEvent``: at equal times instance
        wake-ups, then arrivals, then the Δt timer, then samples) until the next one is later than ``until_s``
        or every request is done. ``run``, ``run_until`` and the step-wise ``advance`` all drive it; ``_auto``
        says whether decision epochs route (off in step-wise driving, where ``dispatch`` routes)."""
        reqs, heap, insts, wake_version = self.requests, self._heap, self.instances, self._wake_version
        n_reqs = len(reqs)
        heappop, heappush = heapq.heappop, heapq.heappush
        while self.num_completed < self.num_requests:
            na = self._next_arrival
            if heap:
                top = heap[0]
                t = top[0]
                if na < n_reqs:
                    ta = reqs[na].arrival_s
                    if ta < t or (ta == t and top[1] > _ARRIVAL):
                        if ta > until_s:
                            break
                        self._arrive_next()
                        continue
                if t > until_s:
                    break
                _, kind, _, _, data = heappop(heap)
                if t > self.now_s:
                    self.now_s = t
                if kind == _WAKE:  # most events: an instance's step (segment of steps) ends
                    i, ver = data  # type: ignore[misc]
                    if ver != wake_version[i]:
                        continue  # a wake-up superseded by a later plan of that instance
                    completed = self.num_completed
                    inst = insts[i]
                    # inst.advance(t), inlined (hot); finishes are recorded as they happen (the finish hook)
                    events: list[Event] = []
                    limit = t + 1e-12
                    while inst.seg_k and inst.seg_end <= limit:
                        inst._finish_segment(inst.seg_end, events)
                        inst._plan(events)
                    if events:  # no failures among them (an instance rejects a request only when it is added)
                        disp = self.dispatcher
                        if disp._on_event is None and type(disp) is Dispatcher:
                            disp.state.apply_all(events)
                        else:
                            self._observe(events)
                    # _reschedule(i), inlined (hot)
                    wake_version[i] = ver = ver + 1
                    te = inst.seg_end if inst.seg_k else inst.next_event_s()
                    if te is not None:
                        self._seq += 1
                        heappush(heap, (te, _WAKE, self._seq, _WAKE, (i, ver)))
                    if self.num_completed != completed and self.dispatcher.waiting:
                        self._epoch()
                elif kind == _ARRIVAL:  # a session's next turn
                    self._arrive(replace(data, arrival_s=t))  # type: ignore[type-var]
                elif kind == _TIMER:
                    self._timer_pending = False
                    self._epoch()
                elif kind == _SAMPLE:
                    self._sample(t)
                else:
                    self._transfer_event(t, data)
            elif na < n_reqs:
                if reqs[na].arrival_s > until_s:
                    break
                self._arrive_next()
            else:
                break

    def _transfer_event(self, t: float, data: object) -> None:
        """A ``SimEvent.TRANSFER`` (only a prefill/decode simulator, ``lbbench.sim.disagg``, schedules them)."""
        raise RuntimeError(f"a KV transfer event at {t} in a simulator without roles")

    def _arrive_next(self) -> None:
        """The next request of the workload list reaches the router."""
        req = self.requests[self._next_arrival]
        self._next_arrival += 1
        if req.arrival_s > self.now_s:
            self.now_s = req.arrival_s
        self._arrive(req)

    def _sample(self, t: float) -> None:
        for inst in self.instances:
            self.timeline.append(MetricsSample(inst.index, t, inst.num_running, inst.num_waiting, inst.kv_usage,
                                               inst.num_preemptions, inst.prefix_cache_hit_rate))
        if not self.done:
            self._push(t + self.timeline_interval_s, _SAMPLE, None)  # type: ignore[operator]

    def next_event_s(self) -> float:
        """Time of the next event (an arrival or a queued event; inf when none is left)."""
        th = self._heap[0][0] if self._heap else _INF
        return min(self.next_arrival_s, th)

    def run_until(self, until_s: float) -> None:
        """Process every event up to ``until_s`` with the dispatcher's router deciding at every epoch (as
        ``run`` does), or until every request is done; ``now_s`` is then the time of the last event processed
        (no later than ``until_s``). A rollout from a ``clone``: set its router, ``run_until`` the horizon."""
        self._auto = True
        self._run_events(until_s)

    def advance(self, until_s: float) -> None:
        """Process every event up to ``until_s`` (step-wise mode: no automatic routing), or until every
        request is done; ``now_s`` is then ``until_s`` (or later, if it already was)."""
        self._auto = False
        self._run_events(until_s)
        self.now_s = max(self.now_s, until_s)
        self.state.now_s = max(self.state.now_s, self.now_s)

    def run(self, router: Router, progress: Callable[[int, int], None] | None = None,
            label: str | None = None) -> list[RequestRecord]:
        """Replay every request through ``router``; returns one record per request, whose ``router`` column is
        ``label`` (default: the router's own name)."""
        self.set_router(router, label or router.name)  # an oracle planner is bound: it forks at its decisions
        self._auto = True
        self._progress = progress
        self._run_events(_INF)
        if not self.done:
            raise RuntimeError(f"simulation stalled with {len(self.dispatcher.queue)} requests at the "
                               f"router (router {router.name!r} never dispatched them)")
        return self.records
