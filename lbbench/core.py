"""Core types shared by every part of lbbench: requests, lifecycle events, the
client-side view of a cluster, and the flat per-request record.

No dependencies beyond the standard library. Everything a router may look at is
here; routers never import the simulator or the live harness.

Token progress is tracked with a per-instance *step clock* so that a simulator
can advance hundreds of running requests by k decode steps in O(1): a request
that is decoding gains exactly one token per engine step, so its generated
count is ``fixed + (clock - base)``. A live backend, which has no step clock,
reports explicit counts instead (``TokensGenerated``) and never ticks. Both feed
the same aggregates, so a router sees the same ``ClusterView`` either way.
"""

from __future__ import annotations

import heapq
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any, Iterable, NamedTuple

# --------------------------------------------------------------------------- requests

#: tokens each prefix hash names when a request does not say (Mooncake's traces)
DEFAULT_PREFIX_BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the load balancer receives it (immutable).

    ``output_tokens`` is the true/target decode length: the simulator generates
    exactly that many tokens and the live harness asks the server for exactly
    that many. ``predicted_output_tokens`` / ``predicted_bucket`` are filled in
    by the dispatcher from the run's predictor when the request arrives.
    """

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    task: str | None = None
    prompt: str | None = None
    prefix_hashes: tuple[int, ...] | None = None
    predicted_output_tokens: int | None = None
    predicted_bucket: int | None = None
    #: tokens each of ``prefix_hashes`` names (None: 512, Mooncake's). Hash ``j`` names tokens
    #: ``[j*B, (j+1)*B)`` of the request's token stream; equal hashes at equal positions mean equal
    #: tokens there. The hashes may run past the prompt: a session turn names the answer it will
    #: generate, which the next turn's prompt repeats (a router uses only the prompt's hashes).
    prefix_block_tokens: int | None = None
    #: multi-turn sessions: the conversation and this request's turn in it (0 = first). A turn after
    #: the first is sent no earlier than ``think_s`` after the previous turn finished (closed loop).
    session_id: int | None = None
    turn: int | None = None
    think_s: float = 0.0
    #: flow control (``lbbench.admission``): the tenant (llm-d's fairness id) and its priority band (higher first)
    tenant: str | None = None
    priority_band: int = 0

    @property
    def expected_output_tokens(self) -> int:
        """Predicted output length when known, else the true one (oracle)."""
        p = self.predicted_output_tokens
        return self.output_tokens if p is None else p


def chain_sessions(requests: Iterable[Request]) -> tuple[list[Request], dict[int, Request]]:
    """Closed-loop sessions: the requests sent on their own schedule (arrival order), and for
    each session turn the turn that follows it (sent once it finished, plus ``think_s``)."""
    requests = list(requests)
    next_turn: dict[int, Request] = {}
    last: dict[int, Request] = {}
    for r in sorted((r for r in requests if r.session_id is not None), key=lambda r: (r.turn or 0, r.request_id)):
        prev = last.get(r.session_id)  # type: ignore[arg-type]
        if prev is not None:
            next_turn[prev.request_id] = r
        last[r.session_id] = r  # type: ignore[index]
    followers = {r.request_id for r in next_turn.values()}
    stream = sorted((r for r in requests if r.request_id not in followers), key=lambda r: (r.arrival_s, r.request_id))
    return stream, next_turn


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Dispatched:
    request: Request
    instance: int
    time_s: float


@dataclass(frozen=True, slots=True)
class FirstToken:
    request_id: int
    instance: int
    time_s: float


@dataclass(frozen=True, slots=True)
class TokensGenerated:
    """Live backends: the request has produced ``generated_tokens`` so far."""

    request_id: int
    instance: int
    time_s: float
    generated_tokens: int


@dataclass(frozen=True, slots=True)
class StepsAdvanced:
    """Simulator: instance ran ``num_steps`` more engine steps; every request
    that is decoding there gained one token per step."""

    instance: int
    time_s: float
    num_steps: int


@dataclass(frozen=True, slots=True)
class Preempted:
    """Simulator (or a backend that can observe it): the request was evicted and
    will be recomputed; it generates nothing until its next first token."""

    request_id: int
    instance: int
    time_s: float


@dataclass(frozen=True, slots=True)
class Finished:
    request_id: int
    instance: int
    time_s: float
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Failed:
    request_id: int
    instance: int
    time_s: float
    error: str


@dataclass(frozen=True, slots=True)
class InstanceHealth:
    """An instance went down (``healthy=False``) or came back."""

    instance: int
    time_s: float
    healthy: bool


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """A scraped ``/metrics`` sample (live) or the simulator's equivalent."""

    instance: int
    time_s: float
    num_running: int
    num_waiting: int
    kv_usage: float
    num_preemptions: int
    #: share of prompt tokens served from the prefix cache so far (None: caching off or unknown)
    prefix_cache_hit_rate: float | None = None


Event = (
    Dispatched | FirstToken | TokensGenerated | StepsAdvanced | Preempted | Finished | Failed
    | InstanceHealth | MetricsSample
)

class Decision(NamedTuple):
    """A router's choice: send ``queue[queue_index]`` to instance ``instance``."""

    queue_index: int
    instance: int


class PairDecision(NamedTuple):
    """A prefill/decode router's choice: ``queue[queue_index]`` decodes on ``instance`` after its prompt is
    prefilled on ``prefill`` and its KV moved there; ``prefill`` None: ``instance`` serves it whole."""

    queue_index: int
    instance: int
    prefill: int | None


def prefill_leg(request: Request) -> Request:
    """What a prefill instance is sent for a disaggregated request: its prompt, one token (the KV is what
    counts; the decode instance makes the tokens the client sees), as llm-d's sidecar sends ``max_tokens=1``."""
    pred = request.predicted_output_tokens
    return replace(request, output_tokens=1, predicted_output_tokens=None if pred is None else 1)


# --------------------------------------------------------------------------- buckets

#: The paper's RL state buckets (tokens): 0-256, 256-2048, >=2048.
DEFAULT_STATE_BUCKETS: tuple[int, ...] = (256, 2048)


def bucket_of(tokens: int, edges: tuple[int, ...]) -> int:
    """Index of the bucket ``tokens`` falls in; ``edges`` are upper bounds
    (exclusive), the last bucket is open-ended."""
    for i, edge in enumerate(edges):
        if tokens < edge:
            return i
    return len(edges)


# --------------------------------------------------------------------------- cluster state


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """What the router may know about an instance's capacity and speed.

    The speed figures come from the instance's profile (``Profile.instance_spec``) or are measured live;
    in a mixed fleet they differ between instances. The defaults stand in for an unknown instance with
    the figures the heuristics assume without a profile (2e-4 s per prompt token, 0.02 s per step);
    only their ratios between instances matter to the capacity-aware routers. The simulator never
    reads them.
    """

    max_num_seqs: int = 256
    kv_capacity_tokens: int = 1 << 30
    min_step_s: float = 0.02
    #: decode throughput (tokens per second, all sequences together) at a typical batch
    batch_decode_tokens_per_s: float = 50.0
    #: prefill throughput (prompt tokens per second) of a typical prompt prefilled alone
    prefill_tokens_per_s: float = 5000.0
    #: the profile's name, a label only (empty when unknown)
    profile_name: str = ""
    #: its part in prefill/decode disaggregation: ``mixed`` (both, the default), ``prefill`` or ``decode``
    #: (``lbbench.fleet.ROLES``)
    role: str = "mixed"


@dataclass(frozen=True, slots=True)
class OutstandingView:
    """One dispatched, unfinished request as seen from the router."""

    request: Request
    dispatched_s: float
    first_token_s: float | None
    generated_tokens: int


@dataclass(frozen=True, slots=True)
class InstanceView:
    """Immutable per-instance aggregates (O(1) to build)."""

    index: int
    healthy: bool
    spec: InstanceSpec
    num_outstanding: int
    num_prefilling: int  # dispatched, no first token yet (or preempted)
    num_decoding: int
    prompt_tokens_pending: int  # prompt tokens of requests not yet producing tokens
    context_tokens: int  # prompt + generated of decoding requests (KV in use, approx.)
    predicted_tokens_remaining: int  # sum of expected output - generated (all outstanding)
    predicted_footprint_tokens: int  # sum of prompt + expected output (final KV need)
    min_remaining_tokens: int | None  # fewest expected tokens left among decoding requests
    prompt_bucket_counts: tuple[int, ...]
    decode_bucket_counts: tuple[int, ...]
    metrics: MetricsSample | None
    _detail: Any = None  # a tuple of rows, or a _DetailSource that builds them once

    @property
    def outstanding(self) -> tuple[OutstandingView, ...]:
        """Per-request detail. Views from ``ClusterState.view(detail=True)`` build it
        on first access (routers that need it only for some instances pay only for
        those); it must be read before the cluster changes again."""
        d = self._detail
        if d is None:
            raise RuntimeError("view built without detail; call ClusterState.view(detail=True)")
        if not isinstance(d, tuple):
            d = d()
            object.__setattr__(self, "_detail", d)
        return d

    @property
    def work_tokens(self) -> int:
        """Prompt tokens still to prefill plus expected decode tokens left."""
        return self.prompt_tokens_pending + max(0, self.predicted_tokens_remaining)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Immutable snapshot of what a client can observe about the cluster."""

    now_s: float
    instances: tuple[InstanceView, ...]

    @property
    def num_instances(self) -> int:
        return len(self.instances)

    def healthy_indices(self) -> list[int]:
        return [iv.index for iv in self.instances if iv.healthy]


class _DetailSource:
    """Builds one instance's per-request rows on demand, refusing once the state moved on."""

    __slots__ = ("state", "index", "gen")

    def __init__(self, state: "ClusterState", index: int, gen: int):
        self.state, self.index, self.gen = state, index, gen

    def __call__(self) -> tuple[OutstandingView, ...]:
        if self.state._gen != self.gen:
            raise RuntimeError("stale ClusterView: the cluster changed since this view was taken; "
                               "read InstanceView.outstanding inside route()")
        inst = self.state._inst[self.index]
        clock = inst.clock
        return tuple(OutstandingView(e.request, e.dispatched_s, e.first_token_s,
                                     e.fixed + (clock - e.base if e.ticking else 0))
                     for e in inst.entries.values())


class _Entry:
    __slots__ = ("request", "expected", "dispatched_s", "first_token_s", "fixed", "base", "ticking",
                 "pb", "db")

    def __init__(self, request: Request, dispatched_s: float, pb: int, db: int):
        self.request = request
        self.expected = request.expected_output_tokens
        self.dispatched_s = dispatched_s
        self.first_token_s: float | None = None
        self.fixed = 0
        self.base = 0
        self.ticking = False
        self.pb = pb
        self.db = db


class _Instance:
    __slots__ = ("spec", "healthy", "entries", "clock", "sum_fixed", "sum_base", "n_ticking",
                 "n_prefilling", "prompt_pending", "prompt_decoding", "sum_expected",
                 "sum_prompt", "heap", "pcounts", "dcounts",
                 "metrics", "view")

    def __init__(self, spec: InstanceSpec, n_pb: int, n_db: int):
        self.spec = spec
        self.healthy = True
        self.entries: dict[int, _Entry] = {}
        self.clock = 0
        self.sum_fixed = 0  # sum of e.fixed over all entries
        self.sum_base = 0  # over ticking entries
        self.n_ticking = 0
        self.n_prefilling = 0
        self.prompt_pending = 0
        self.prompt_decoding = 0
        self.sum_expected = 0
        self.sum_prompt = 0
        self.heap: list[tuple[int, int]] = []  # (finish clock = expected + base - fixed, rid)
        self.pcounts = [0] * n_pb
        self.dcounts = [0] * n_db
        self.metrics: MetricsSample | None = None
        self.view: InstanceView | None = None  # the last view built without detail; None once an event lands


#: an instance's finish heap is rebuilt once it holds more than twice its ticking requests plus this many keys
#: (stale keys outnumber live ones by more than this); any value bounds the heap, this one keeps small heaps from
#: being rebuilt every few pushes
_HEAP_SLACK = 64


def _compact(inst: _Instance) -> None:
    """Rebuild ``inst.heap`` with its live keys only. Stale keys (a request's earlier counts, or a finished
    request) leave the heap only when they reach its top; live token counts push one per update, so a long run
    would otherwise keep every one of them. The live keys are the ticking entries' current keys, and every one
    of them is in the heap (each change of a ticking key is pushed): they are read from whichever is shorter,
    the entries or the heap, so a rebuild costs at most the heap's length, however many requests wait at the
    instance. It runs when ``len(heap) > 2 * n_ticking + _HEAP_SLACK``, so more than half the heap is stale and
    dropped: at most two reads per key ever pushed. The minimum, all the heap is read for, is unchanged."""
    entries = inst.entries
    if len(entries) <= len(inst.heap):
        heap = [(e.expected - e.fixed + e.base, rid) for rid, e in entries.items() if e.ticking]
    else:
        live: dict[int, int] = {}  # one key per request (the same key can be pushed again after a preemption)
        for key, rid in inst.heap:
            e = entries.get(rid)
            if e is not None and e.ticking and key == e.expected - e.fixed + e.base:
                live[rid] = key
        heap = [(key, rid) for rid, key in live.items()]
    heapq.heapify(heap)
    inst.heap = heap


class ClusterState:
    """Client-side model of the cluster, fed only by lifecycle events."""

    def __init__(self, specs: Iterable[InstanceSpec],
                 prompt_buckets: tuple[int, ...] = DEFAULT_STATE_BUCKETS,
                 decode_buckets: tuple[int, ...] = DEFAULT_STATE_BUCKETS):
        self.prompt_buckets = tuple(prompt_buckets)
        self.decode_buckets = tuple(decode_buckets)
        n_pb, n_db = len(self.prompt_buckets) + 1, len(self.decode_buckets) + 1
        self._inst = [_Instance(s, n_pb, n_db) for s in specs]
        self._where: dict[int, int] = {}
        self._gen = 0  # bumped by every event; lazy per-request detail checks it
        self.now_s = 0.0

    @property
    def num_instances(self) -> int:
        return len(self._inst)

    def instance_of(self, request_id: int) -> int | None:
        return self._where.get(request_id)

    def outstanding_ids(self, instance: int) -> list[int]:
        return list(self._inst[instance].entries)

    def replica(self) -> "ClusterState":
        """An empty state of the same instances (specs) and buckets: one fed the same events later (a router's
        delayed view, ``Dispatcher(signal_lag_s=...)``)."""
        return ClusterState([inst.spec for inst in self._inst], self.prompt_buckets, self.decode_buckets)

    def composition(self) -> tuple[tuple[int, int, int, bool], ...]:
        """Per instance ``(num_outstanding, num_prefilling, prompt_tokens_pending, healthy)``, cheaper than a
        view: it changes when a request is dispatched, starts decoding, is preempted or finishes, or an
        instance's health changes (not with every token)."""
        return tuple((len(e.entries), e.n_prefilling, e.prompt_pending, e.healthy) for e in self._inst)

    # -- event handling ---------------------------------------------------------------
    def apply_all(self, events: Iterable[Event]) -> None:
        """``apply`` each event in order; the simulator's frequent events (``StepsAdvanced``, ``FirstToken``,
        ``Finished``, by exact type) handled inline."""
        insts = self._inst
        apply = self.apply
        for ev in events:
            cls = type(ev)
            if cls is StepsAdvanced or cls is FirstToken or cls is Finished:
                t = ev.time_s
                if t > self.now_s:
                    self.now_s = t
                self._gen += 1
                inst = insts[ev.instance]
                inst.view = None
                if cls is StepsAdvanced:
                    inst.clock += ev.num_steps
                elif cls is FirstToken:
                    e = inst.entries.get(ev.request_id)
                    if e is not None and e.first_token_s is None:
                        self._start_decoding(inst, e, t)
                else:
                    self._remove(ev.instance, ev.request_id)
            else:
                apply(ev)

    def apply(self, ev: Event) -> None:  # noqa: C901 - one branch per event type
        if ev.time_s > self.now_s:
            self.now_s = ev.time_s
        self._gen += 1
        inst = self._inst[ev.instance]  # every event names its instance
        inst.view = None  # only that instance's view changes
        if isinstance(ev, StepsAdvanced):
            inst.clock += ev.num_steps
        elif isinstance(ev, Dispatched):
            self._dispatch(ev)
        elif isinstance(ev, FirstToken):
            e = inst.entries.get(ev.request_id)
            if e is not None and e.first_token_s is None:
                self._start_decoding(inst, e, ev.time_s)
        elif isinstance(ev, TokensGenerated):
            e = inst.entries.get(ev.request_id)
            if e is None:
                return
            if e.first_token_s is None:
                self._start_decoding(inst, e, ev.time_s)
            delta = ev.generated_tokens - (e.fixed + (inst.clock - e.base if e.ticking else 0))
            if delta:
                e.fixed += delta
                inst.sum_fixed += delta
                if e.ticking:
                    heapq.heappush(inst.heap, (e.expected - e.fixed + e.base, e.request.request_id))
                    if len(inst.heap) > 2 * inst.n_ticking + _HEAP_SLACK:
                        _compact(inst)
        elif isinstance(ev, Preempted):
            e = inst.entries.get(ev.request_id)
            if e is not None and e.first_token_s is not None:
                if e.ticking:
                    self._stop_ticking(inst, e)
                # back to prefilling: its context must be recomputed
                inst.prompt_decoding -= e.request.prompt_tokens
                inst.prompt_pending += e.request.prompt_tokens
                inst.n_prefilling += 1
                e.first_token_s = None
        elif isinstance(ev, (Finished, Failed)):
            self._remove(ev.instance, ev.request_id)
        elif isinstance(ev, InstanceHealth):
            inst.healthy = ev.healthy
        elif isinstance(ev, MetricsSample):
            inst.metrics = ev

    def _dispatch(self, ev: Dispatched) -> None:
        r = ev.request
        inst = self._inst[ev.instance]
        e = _Entry(r, ev.time_s, bucket_of(r.prompt_tokens, self.prompt_buckets),
                   bucket_of(e_exp := r.expected_output_tokens, self.decode_buckets))
        inst.entries[r.request_id] = e
        self._where[r.request_id] = ev.instance
        inst.n_prefilling += 1
        inst.prompt_pending += r.prompt_tokens
        inst.sum_expected += e_exp
        inst.sum_prompt += r.prompt_tokens
        inst.pcounts[e.pb] += 1
        inst.dcounts[e.db] += 1

    def _start_decoding(self, inst: _Instance, e: _Entry, time_s: float) -> None:
        """A token was produced at ``time_s`` after a (re)prefill; from now on
        the request gains one token per engine step (simulator) or reports its
        count explicitly (live)."""
        e.first_token_s = time_s
        inst.n_prefilling -= 1
        inst.prompt_pending -= e.request.prompt_tokens
        inst.prompt_decoding += e.request.prompt_tokens
        e.fixed += 1
        inst.sum_fixed += 1
        e.ticking = True
        e.base = inst.clock
        inst.n_ticking += 1
        inst.sum_base += e.base
        heapq.heappush(inst.heap, (e.expected - e.fixed + e.base, e.request.request_id))
        if len(inst.heap) > 2 * inst.n_ticking + _HEAP_SLACK:
            _compact(inst)

    def _stop_ticking(self, inst: _Instance, e: _Entry) -> None:
        gen = e.fixed + inst.clock - e.base
        inst.sum_fixed += gen - e.fixed
        e.fixed = gen  # sum_fixed now also counts what ticked
        e.ticking = False
        inst.n_ticking -= 1
        inst.sum_base -= e.base
        if len(inst.heap) > 2 * inst.n_ticking + _HEAP_SLACK:  # fewer ticking: the bound is lower
            _compact(inst)

    def _remove(self, instance: int, request_id: int) -> None:
        inst = self._inst[instance]
        e = inst.entries.pop(request_id, None)
        self._where.pop(request_id, None)
        if e is None:
            return
        if e.ticking:
            self._stop_ticking(inst, e)
        inst.sum_fixed -= e.fixed
        if e.first_token_s is None:
            inst.n_prefilling -= 1
            inst.prompt_pending -= e.request.prompt_tokens
        else:
            inst.prompt_decoding -= e.request.prompt_tokens
        inst.sum_expected -= e.expected
        inst.sum_prompt -= e.request.prompt_tokens
        inst.pcounts[e.pb] -= 1
        inst.dcounts[e.db] -= 1

    # -- queries ----------------------------------------------------------------------
    def generated_tokens(self, request_id: int) -> int:
        i = self._where[request_id]
        inst = self._inst[i]
        e = inst.entries[request_id]
        return e.fixed + (inst.clock - e.base if e.ticking else 0)

    def _min_remaining(self, inst: _Instance) -> int | None:
        heap = inst.heap
        while heap:
            key, rid = heap[0]
            e = inst.entries.get(rid)
            if e is None or not e.ticking or key != e.expected - e.fixed + e.base:
                heapq.heappop(heap)  # stale
                continue
            return key - inst.clock
        return None

    def view(self, detail: bool = False) -> ClusterView:
        """The snapshot routers see. Without detail, an instance no event has touched since the last view keeps
        its (immutable) ``InstanceView``: between two decisions most instances do not change."""
        out = []
        for i, inst in enumerate(self._inst):
            if not detail and inst.view is not None:
                out.append(inst.view)
                continue
            generated = inst.sum_fixed + inst.n_ticking * inst.clock - inst.sum_base
            n = len(inst.entries)
            # positional, in field order (index, healthy, spec, num_outstanding, num_prefilling, num_decoding,
            # prompt_tokens_pending, context_tokens, predicted_tokens_remaining, predicted_footprint_tokens,
            # min_remaining_tokens, prompt_bucket_counts, decode_bucket_counts, metrics, _detail): a view per
            # touched instance per decision
            out.append(iv := InstanceView(
                i, inst.healthy, inst.spec, n, inst.n_prefilling, n - inst.n_prefilling, inst.prompt_pending,
                inst.prompt_decoding + generated, inst.sum_expected - generated, inst.sum_prompt + inst.sum_expected,
                self._min_remaining(inst) if inst.heap else None, tuple(inst.pcounts), tuple(inst.dcounts),
                inst.metrics, _DetailSource(self, i, self._gen) if detail else None))
            if not detail:
                inst.view = iv
        return ClusterView(self.now_s, tuple(out))


# --------------------------------------------------------------------------- records


@dataclass(slots=True)
class RequestRecord:
    """One flat row per request; goes straight into Polars.

    Times are absolute seconds on the run's clock (0 = first arrival's epoch).
    Derived columns (router_wait_s, ttft_s, e2e_s, ...) are computed in reports.
    """

    run_id: str
    router: str
    seed: int
    request_id: int
    task: str | None
    instance: int
    arrival_s: float
    dispatch_s: float
    first_token_s: float | None
    finish_s: float | None
    prompt_tokens: int
    output_tokens: int  # requested/true length
    generated_tokens: int  # what actually came back
    predicted_output_tokens: int | None = None
    predicted_bucket: int | None = None
    num_preemptions: int | None = None
    tbt_mean_s: float | None = None
    tbt_p99_s: float | None = None
    tbt_max_s: float | None = None
    planned_send_s: float | None = None  # live runs: schedule
    actual_send_s: float | None = None  # live runs: when the request left the client
    server_prompt_tokens: int | None = None  # usage as the server counted it
    server_output_tokens: int | None = None
    http_status: int | None = None
    error: str | None = None
    session_id: int | None = None  # multi-turn sessions: conversation and turn (0 = first)
    turn: int | None = None
    think_s: float | None = None  # closed loop: pause after the previous turn finished
    cached_prompt_tokens: int | None = None  # prompt tokens served from the prefix cache (first admission)
    # prefill/decode disaggregation (None when the request was served whole on ``instance``)
    prefill_instance: int | None = None  # where its prompt was prefilled
    prefill_done_s: float | None = None  # its prefill ended there (the engine's time; the client sees no token)
    kv_ready_s: float | None = None  # its KV landed on ``instance`` (the link's queue, latency and bytes)
    decode_admit_s: float | None = None  # ``instance`` took it (later than kv_ready_s when its blocks waited)
    transfer_bytes: float | None = None  # KV bytes moved

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def for_request(cls, req: "Request", *, run_id: str, router: str, seed: int, instance: int,
                    dispatch_s: float, first_token_s: float | None, finish_s: float | None,
                    generated_tokens: int, token_times: Any = None, **measured: Any) -> "RequestRecord":
        """The record of ``req`` as the simulator and live runs both build it: the request's own fields copied,
        the time-between-tokens statistics computed from ``token_times`` (:func:`tbt_stats`), and the rest of
        what was measured (``measured``: preemptions, send times, server counts, status, error...)."""
        mean, p99, mx = tbt_stats(token_times) if token_times is not None else (None, None, None)
        # positional, in field order (checked below the class): a record per request, and keywords cost
        rec = cls(run_id, router, seed, req.request_id, req.task, instance, req.arrival_s, dispatch_s, first_token_s,
                  finish_s, req.prompt_tokens, req.output_tokens, generated_tokens, req.predicted_output_tokens,
                  req.predicted_bucket, None, mean, p99, mx, None, None, None, None, None, None, req.session_id,
                  req.turn, req.think_s if req.session_id is not None else None, None)
        for name, value in measured.items():
            if name not in _MEASURED_FIELDS:
                raise TypeError(f"for_request: {name!r} is not a measured field of {cls.__name__}")
            setattr(rec, name, value)
        return rec


#: the record fields ``RequestRecord.for_request`` leaves to what was measured
_MEASURED_FIELDS = frozenset(("num_preemptions", "planned_send_s", "actual_send_s", "server_prompt_tokens",
                              "server_output_tokens", "http_status", "error", "cached_prompt_tokens",
                              "prefill_instance", "prefill_done_s", "kv_ready_s", "decode_admit_s", "transfer_bytes"))
#: the record fields only a disaggregated request fills (None otherwise)
PD_RECORD_FIELDS = ("prefill_instance", "prefill_done_s", "kv_ready_s", "decode_admit_s", "transfer_bytes")
assert tuple(f.name for f in fields(RequestRecord)) == (
    "run_id", "router", "seed", "request_id", "task", "instance", "arrival_s", "dispatch_s", "first_token_s",
    "finish_s", "prompt_tokens", "output_tokens", "generated_tokens", "predicted_output_tokens", "predicted_bucket",
    "num_preemptions", "tbt_mean_s", "tbt_p99_s", "tbt_max_s", "planned_send_s", "actual_send_s",
    "server_prompt_tokens", "server_output_tokens", "http_status", "error", "session_id", "turn", "think_s",
    "cached_prompt_tokens", *PD_RECORD_FIELDS), \
    "RequestRecord.for_request builds records positionally: keep it in field order"


def tbt_stats(times: Any) -> tuple[float | None, float | None, float | None]:
    """Mean, p99 (linear interpolation, as numpy's default percentile) and max time between consecutive tokens
    of one request, from the arrival time of every token (a list or a numpy array); None with fewer than two
    tokens. The one definition for simulated and live records: the mean is (last - first) / gaps."""
    n = len(times) - 1
    if n < 1:
        return None, None, None
    pos = 0.99 * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    if hasattr(times, "dtype"):  # numpy, the simulator's token times: sorted in place, no list (it is hot)
        g = times[1:] - times[:-1]
        g.sort()
        if times.dtype.char == "d":  # float64 read out as Python floats: the same IEEE arithmetic, fewer calls
            glo, ghi = g.item(lo), g.item(hi)
            return (times.item(-1) - times.item(0)) / n, glo + (ghi - glo) * (pos - lo), g.item(-1)
        glo, ghi, gmax = float(g[lo]), float(g[hi]), float(g[-1])
    else:
        gaps = sorted([b - a for a, b in zip(times, times[1:])])
        glo, ghi, gmax = gaps[lo], gaps[hi], gaps[-1]
    return float((times[-1] - times[0]) / n), float(glo + (ghi - glo) * (pos - lo)), float(gmax)


RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))


# --------------------------------------------------------------------------- fast construction


def _fast_frozen_init(cls: type) -> type:
    """Give a frozen, slotted dataclass an ``__init__`` that writes each slot through its descriptor.

    The generated frozen ``__init__`` calls ``object.__setattr__`` per field, which made building events and
    views a large share of a simulated episode (tens of thousands of events, a view per routing decision).
    Same signature and defaults; instances stay immutable (``__setattr__`` still raises).
    """
    fs = [f for f in fields(cls) if f.init]
    ns: dict[str, Any] = {}
    params = []
    for f in fs:
        if f.kw_only or f.default_factory is not MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: keyword-only or factory defaults are not supported")
        ns[f"_set_{f.name}"] = getattr(cls, f.name).__set__
        if f.default is MISSING:
            params.append(f.name)
        else:
            ns[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
    body = "".join(f"    _set_{f.name}(self, {f.name})\n" for f in fs) or "    pass\n"
    exec(f"def __init__(self, {', '.join(params)}):\n{body}", ns)  # noqa: S102 - generated from field names
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[misc]
    return cls


for _cls in (Request, Dispatched, FirstToken, TokensGenerated, StepsAdvanced, Preempted, Finished, Failed,
             InstanceHealth, MetricsSample, InstanceSpec, OutstandingView, InstanceView, ClusterView):
    _fast_frozen_init(_cls)
del _cls
