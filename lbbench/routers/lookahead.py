"""``lookahead``: an oracle planner that bounds what routing can buy (not deployable).

At each decision it forks the simulator (``ClusterSim.clone``), applies each candidate action to a fork and
rolls the fork forward with a *base policy* over a horizon, with the true output lengths and the true future
arrivals, then takes the candidate whose future costs least. It reads what no deployed router can (true
lengths, arrivals to come), so it runs only on the simulator and is labelled an oracle wherever it prints.

**Candidates.** ``reorder=False`` (default): the paper's action space, the head of the queue to one of the
healthy instances, or defer. ``reorder=True``: any of the ``k`` oldest and the ``k`` shortest (prompt + true
output tokens) queued requests to any healthy instance, or defer. The base policy's own action is always a
candidate, evaluated by letting the base policy itself run the fork from this epoch on.

**Base policy** (``base``): a registered router name (on a mixed fleet a capacity-aware one such as
``least_work_speed`` or ``jsq_speed``), ``best``, ``backfill_gate`` (default) or ``gate``. ``best`` runs
each base of ``best_of`` on a fork of the simulator from the start of the run to the end (exact, oracle) and
keeps the one with the lowest total E2E for the whole run (one extra episode per base). ``backfill_gate`` and ``gate`` are
``late_binding_srpt`` with ``order=fcfs, kv_slack=0, calibrate=False``, a gate on projected KV footprint:
``backfill_gate`` is the hand-set gate of the headroom tables (when the head fits nowhere it dispatches the
oldest of the 16 oldest that fits, so *its* action may be a request behind the head; the best cheap heuristic
measured on 4 x V100, +7.9 % over round robin); ``gate`` (``backfill_depth=1``, ``refresh_s=1``) stays
strictly at the head of the line and gains less.

**The base's state in the rollouts.** A router that remembers (prefix trees, in-flight tokens, a KV-event
index, a learned model) is only the base policy *with its memory*: a fresh one is cache-blind. So the planner
keeps one live base router beside the run (``LookaheadRouter.live``): it sees every event the run reports
(``on_event``), is told of every placement, whoever decided it (``placed``, the same hook its own ``route``
uses), and a precise prefix base is subscribed to the run's KV events. Every rollout routes with a copy of it
(``copy_router``: ``copy.deepcopy``, the profiles shared; the prefix trees and the KV index copy themselves one C
copy per instance), which the fork subscribes to its own KV events (``set_router``); the candidate's own
placement is told to the copy before the fork runs. The base policy from this state is then exactly what
running the base from the start would be (its memory is a function of the placements and events so far), and the
never-worse property below holds for stateful bases too. ``plan_action`` (a pure function of a simulator, no
history) builds a fresh base.

**Cost of a rollout** (sum of E2E latencies, from the decision on). Let ``T = now + horizon_s``. The
requests in scope are those in the system now (router queue and instances) and those arriving by ``T``.
A request that finishes by ``T`` costs ``finish - max(arrival, now)``; one still unfinished at ``T`` costs
``T - max(arrival, now)`` plus an estimate of what it still waits: the unfinished requests are served as a
fluid FIFO queue (in arrival order) by the cluster, each needing its remaining prefill (prompt tokens not yet
computed, less, for a request nothing of which is computed yet, the prompt tokens the prefix cache holds for it
in the fork: on its instance, or for one still at the router the best instance's (``ClusterSim.
cached_prompt_tokens``, the scheduler's leading-block lookup); times the per-token prefill time) and decode work (output tokens not yet generated, times one
per-token decode cost for the whole run, ``decode_token_s``: a full batch's step time over its size, so
that where a request sits in a batch never makes its work look cheaper), ``num_instances`` instance-seconds
of work per second; a request's estimate is the cumulative work up to and including it divided by
``num_instances``. Each instance charges its own costs (``instance_costs``: from its own profile): a request
on an instance is charged that instance's per-token costs, a request still at the router the fleet's (the
harmonic mean over the instances, so that the fleet's throughput is theirs summed); on a uniform fleet
these are one profile's costs. Latency before the decision is
sunk (the same for every candidate) and is left out. With ``horizon_s=inf`` ("until done") every request
finishes in the fork, no estimate is used, and the cost is exact: with exact rollouts the planner is never
worse than its base policy (the rollout policy-improvement property, tested).

**Margin and screen.** The finite horizon and the fluid estimate are noisy, and their errors lean one way
(work dispatched now shows up as progress inside the horizon; the preemptions it causes later mostly do not).
``margin_s``: a candidate replaces the base's own action only when it lowers the cost by more than
``margin_s`` per request in scope. ``screen_s``: every candidate is first rolled a short ``screen_s``; only
the cheapest one past the margin is rolled the full horizon, against the base's full rollout, and must pass
the margin again. Exact rollouts (``horizon_s=done``) estimate nothing: one stage, no margin, so the
never-worse property is untouched by both.

**Rollouts of the gate.** A rollout whose base is ``late_binding_srpt`` skips the epochs at which the gate
would defer anyway (nothing it reads has changed since its last deferral, within its own ``refresh_s``):
the same decisions without building a view every ``Δt`` (tested against the plain dispatcher).

**Deferral refresh.** While the router defers, the dispatcher offers the queue every ``Δt``. A deferral
stands without re-planning until something the base could react to changes (the head of the queue, or any
instance's outstanding or prefilling count; arrivals behind the head do not re-plan) or ``refresh_s``
passes (``refresh_s=0``: re-plan at every epoch, the exact mode the property test uses).

**The simulator's public face.** Forks are driven only through ``ClusterSim``'s rollout API (``clone``,
``set_router``, ``send``, ``run_until``, ``pending_work``) and the dispatcher's ``guard``; the per-token costs
of the estimate are read from the simulator's ``profiles`` (the planner is an oracle), kept here per
simulator and handed to its forks.

``plan_action(sim, ...)`` is the same decision as a pure function of a simulator at a decision epoch, for
use as a teacher (imitation learning) outside a run.
"""

from __future__ import annotations

import copy
import math
import weakref
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple, Sequence

import numpy as np

from ..core import ClusterView, Decision, Dispatched, Event, Request
from ..errors import InputError
from ..profiles import Profile
from ..sim.cluster import ClusterSim
from .late_binding import LateBindingRouter
from .registry import get_router, register

#: a router with this attribute reads the simulator (``bind_simulator``) and is refused on live backends
ORACLE_NOTE = "not deployable: sees true lengths and future arrivals"

#: the default base policy: a head-of-line KV gate (``late_binding_srpt`` in the paper's action space)
GATE_OPTIONS: dict[str, Any] = {"order": "fcfs", "kv_slack": 0.0, "backfill_depth": 1, "calibrate": False,
                                "refresh_s": 1.0}


#: the hand-set gate of the headroom tables (``late_binding_srpt`` with ``order=fcfs, kv_slack=0``): the same KV
#: gate, but a head that fits nowhere is backfilled past by one of the 16 oldest that fits (so its own action
#: may dispatch a request behind the head); without calibration (a fresh router has no samples to calibrate on)
BACKFILL_GATE_OPTIONS: dict[str, Any] = {"order": "fcfs", "kv_slack": 0.0, "backfill_depth": 16, "calibrate": False}


class PlannerError(InputError):
    """The planner cannot run (no simulator bound, unknown base policy, bad option)."""


@dataclass(frozen=True)
class LookaheadParams:
    """Every knob of the planner."""

    reorder: bool = False
    """False: the paper's action space (head of the queue to an instance, or defer); True: any of the ``k``
    oldest and ``k`` shortest queued requests."""
    horizon_s: float = 5.0
    """Seconds each candidate is rolled forward (``inf``: until every request is done, exact)."""
    base: str = "backfill_gate"
    """Base policy of the rollouts: ``backfill_gate`` (the hand-set gate of the headroom tables, which may
    dispatch one of the 16 oldest past a head that fits nowhere), ``gate`` (the same gate strictly head of
    line), a registered router name (on a mixed fleet a capacity-aware one: ``least_work_speed``,
    ``jsq_speed``) or ``best`` (the cheapest of ``best_of``, each run to the end on a fork when the run starts).
    Default ``backfill_gate``: the planner then starts from the best cheap heuristic measured on 4 x V100
    (``gate`` alone gives about two thirds of its gain)."""
    best_of: tuple[str, ...] = ("backfill_gate", "least_work_speed", "jsq_speed", "mcu")
    """With ``base=best``: the bases tried (a tuple or a comma-separated string of names)."""
    k: int = 2
    """With ``reorder``: how many of the oldest and of the shortest queued requests are candidates."""
    refresh_s: float = 0.2
    """A deferral stands this long unless the head of the queue or an instance's composition changes (0: always
    re-plan)."""
    margin_s: float = 0.05
    """A candidate replaces the base policy's own action only when it lowers the mean cost per request in scope
    by more than this many seconds (``cost_base - cost_candidate > margin_s * requests_in_scope``). The finite
    horizon and the fluid tail estimate are noisy; a margin keeps the planner on its base unless a candidate
    is clearly better. 0: strictly cheaper. Exact rollouts (``horizon_s=done``) estimate nothing and take no
    margin, so the never-worse-than-the-base property holds with any margin. Default 0.05, chosen
    on tuning seed 1000 (4 x V100 physics, paper-mix, 20 req/s, oracle lengths, 600 requests): 0.02 gave
    19.28 s mean E2E, 0.05 19.11 s, no replacement at all (a huge margin) 19.26 s."""
    screen_s: float = 1.0
    """Two-stage planning when ``0 < screen_s < horizon_s``: every candidate (the base's own action included) is
    rolled ``screen_s`` seconds; only the cheapest candidate that beats the base by the margin there is rolled
    the full ``horizon_s``, against the base's full rollout, and it replaces the base's action only if it
    still beats it by the margin. Most decisions then cost short rollouts. 0: one stage; exact rollouts
    (``horizon_s=done``) are always one stage, so the never-worse property does not rest on a screen. Default 1 s: with the
    rollout epochs of the gate it cut a 300-request episode from 461 s to 55 s of CPU (seed 1000, no
    margin); a shorter screen was not measured."""


def parse_params(options: dict[str, Any]) -> LookaheadParams:
    """The planner's parameters from its router options (``--router-opt lookahead.KEY=VALUE``); a
    ``PlannerError`` naming a bad one."""
    known = {f.name for f in fields(LookaheadParams)}
    unknown = set(options) - known
    if unknown:
        raise PlannerError(f"lookahead: unknown option(s) {', '.join(sorted(unknown))} "
                           f"(known: {', '.join(sorted(known))})")
    opts = dict(options)
    if "horizon_s" in opts:
        h = opts["horizon_s"]
        if isinstance(h, str) and h.lower() in ("inf", "done", "until_done"):
            opts["horizon_s"] = math.inf
        try:
            opts["horizon_s"] = float(opts["horizon_s"])
        except (TypeError, ValueError):
            raise PlannerError(f"lookahead: horizon_s {h!r} is not a number of seconds or 'done'") from None
        if not opts["horizon_s"] > 0:
            raise PlannerError(f"lookahead: horizon_s {h!r} must be > 0")
    for name in ("margin_s", "screen_s"):
        if name in opts:
            try:
                opts[name] = float(opts[name])
            except (TypeError, ValueError):
                raise PlannerError(f"lookahead: {name} {opts[name]!r} is not a number of seconds") from None
            if not opts[name] >= 0:
                raise PlannerError(f"lookahead: {name} {opts[name]!r} must be >= 0")
    if "best_of" in opts:
        b = opts["best_of"]
        names = tuple(x.strip() for x in b.split(",") if x.strip()) if isinstance(b, str) else tuple(b)
        if not names or "best" in names:
            raise PlannerError(f"lookahead: best_of {b!r} must name one or more bases (not best)")
        opts["best_of"] = names
    if "k" in opts and (not isinstance(opts["k"], int) or opts["k"] < 1):
        raise PlannerError(f"lookahead: k {opts['k']!r} must be an integer >= 1")
    if "reorder" in opts and not isinstance(opts["reorder"], bool):
        raise PlannerError(f"lookahead: reorder {opts['reorder']!r} must be true or false")
    return LookaheadParams(**opts)


def make_base(base: str, num_instances: int, seed: int, profile: Profile | None) -> Any:
    """A fresh base-policy router."""
    if base == "gate":
        return get_router("late_binding_srpt", num_instances=num_instances, seed=seed, profile=profile,
                          **GATE_OPTIONS)
    if base == "backfill_gate":
        return get_router("late_binding_srpt", num_instances=num_instances, seed=seed, profile=profile,
                          **BACKFILL_GATE_OPTIONS)
    if base == "lookahead":
        raise PlannerError("lookahead: base cannot be lookahead itself")
    if base == "best":
        raise PlannerError("lookahead: base best is resolved on the simulator first (resolve_base)")
    return get_router(base, num_instances=num_instances, seed=seed, profile=profile)


def copy_router(router: Any, sim: ClusterSim) -> Any:
    """An independent copy of a base router with its memory (``copy.deepcopy``; the simulator's profiles, which
    never change, are shared)."""
    return copy.deepcopy(router, {id(p): p for p in sim.profiles})


def check_base(params: "LookaheadParams", num_instances: int, seed: int, profile: Profile | None) -> None:
    """Fail early on a base (or a ``best_of`` entry) that cannot be built."""
    for b in (params.best_of if params.base == "best" else (params.base,)):
        make_base(b, num_instances, seed, profile)


def base_costs(sim: ClusterSim, bases: Sequence[str], seed: int = 0,
               pending: Sequence[tuple[Request, int]] = ()) -> dict[str, float]:
    """Total E2E from ``sim``'s current time (sunk latency left out) of each base run on its own fork to the end
    of the episode (after the ``pending`` dispatches of this epoch): the exact cost of following that base from
    here."""
    out = {}
    for b in bases:
        fork = sim.clone()
        now, first = fork.now_s, len(fork.records)
        fork.set_router(make_base(b, fork.num_instances, seed, fork.profile))
        fork.send(list(pending) + fork.dispatcher.decide(now))
        out[b] = _rollout(fork, now, math.inf, first, instance_costs(sim))[0]
    return out


def resolve_base(sim: ClusterSim, params: "LookaheadParams", seed: int = 0,
                 pending: Sequence[tuple[Request, int]] = ()) -> "LookaheadParams":
    """``params`` with ``base=best`` replaced by the base of ``best_of`` cheapest from ``sim``'s current time
    (``base_costs``; the first on a tie); other bases unchanged."""
    if params.base != "best":
        return params
    costs = base_costs(sim, params.best_of, seed, pending)
    return replace(params, base=min(params.best_of, key=lambda b: costs[b]))


# ------------------------------------------------------------------------------------------------ rollouts


def _candidates(queue: Sequence[Request], view: ClusterView, reorder: bool, k: int) -> list[Decision | None]:
    healthy = view.healthy_indices()
    if not queue or not healthy:
        return [None]
    if reorder:
        n = len(queue)
        oldest = list(range(min(k, n)))
        by_size = sorted(range(n), key=lambda q: (queue[q].prompt_tokens + queue[q].output_tokens, q))[:k]
        picks = list(dict.fromkeys(oldest + by_size))
    else:
        picks = [0]
    return [None] + [Decision(q, i) for q in picks for i in healthy]


class InstanceCosts(NamedTuple):
    """Per-token costs of the estimate, in seconds of an instance's time (``instance_costs``)."""

    prefill_token_s: tuple[float, ...]
    """Per instance: its profile's prefill time per token."""
    decode_token_s: tuple[float, ...]
    """Per instance: ``decode_token_s`` of its profile."""
    queued_prefill_token_s: float
    """For a request still at the router: the fleet's (harmonic mean over the instances)."""
    queued_decode_token_s: float


#: ``instance_costs`` of each simulator planned on (computed once per episode; forks are given it)
_COSTS: "weakref.WeakKeyDictionary[ClusterSim, InstanceCosts]" = weakref.WeakKeyDictionary()


def _profile_decode_token_s(prof: Profile, mean_tokens: float) -> float:
    n = min(float(prof.max_num_seqs), max(1.0, prof.kv_capacity_tokens / max(1.0, mean_tokens)))
    return (prof.base_s + prof.decode_seq_s * n + prof.context_token_s * 0.5 * prof.kv_capacity_tokens) / n


def _fleet_cost(per_instance: Sequence[float]) -> float:
    """The cost per token of the fleet as one: the harmonic mean (one instance's value on a uniform fleet)."""
    first = per_instance[0]
    if all(x == first for x in per_instance):
        return first
    return len(per_instance) / sum(1.0 / x if x > 0 else math.inf for x in per_instance)


def instance_costs(sim: ClusterSim) -> InstanceCosts:
    """Each instance's per-token costs, from its own profile (``sim.profiles``), one constant per simulator.
    Decode: the batch that fills the instance's KV cache with requests of the workload's mean size (at most
    ``max_num_seqs``), its step time over its size. The same for every request and every candidate on an
    instance, so the estimate rewards real progress (tokens made, no recompute) and never where a request
    happens to sit in a batch."""
    cached = _COSTS.get(sim)
    if cached is not None:
        return cached
    reqs = sim.requests
    mean_tokens = (sum(r.prompt_tokens + 0.5 * r.output_tokens for r in reqs) / len(reqs)) if reqs else 1.0
    memo: dict[int, tuple[float, float]] = {}
    pre, dec = [], []
    for prof in getattr(sim, "profiles", None) or [sim.profile] * sim.num_instances:
        c = memo.get(id(prof))
        if c is None:
            c = memo[id(prof)] = (prof.prefill_token_s, _profile_decode_token_s(prof, mean_tokens))
        pre.append(c[0])
        dec.append(c[1])
    costs = InstanceCosts(tuple(pre), tuple(dec), _fleet_cost(pre), _fleet_cost(dec))
    _COSTS[sim] = costs
    return costs


def decode_token_s(sim: ClusterSim) -> float:
    """Instance-seconds per decode token of the fleet as one (``instance_costs``): on a uniform fleet a full
    batch's step time over its size."""
    return instance_costs(sim).queued_decode_token_s


def _as_costs(sim: ClusterSim, tau: "float | InstanceCosts | None") -> InstanceCosts:
    if tau is None:
        return instance_costs(sim)
    if isinstance(tau, InstanceCosts):
        return tau
    a = sim.profile.prefill_token_s  # one decode cost for the whole fleet, one profile's prefill cost
    m = sim.num_instances
    return InstanceCosts((a,) * m, (float(tau),) * m, a, float(tau))


def _unfinished_estimate_s(sim: ClusterSim, now_s: float, end_s: float, costs: InstanceCosts
                           ) -> tuple[float, int]:
    """Time-in-system within the horizon plus the fluid-FIFO estimate of every unfinished request (see the
    module docstring), and how many requests that is."""
    pre, dec = costs.prefill_token_s, costs.decode_token_s
    qa, qtau = costs.queued_prefill_token_s, costs.queued_decode_token_s
    rows: list[tuple[float, float]] = []  # (arrival, remaining work in instance-seconds)
    m = sim.num_instances
    for i, r, comp, gen in sim.pending_work():
        a, tau = (qa, qtau) if i is None else (pre[i], dec[i])
        hit = 0
        if comp == 0 and r.prefix_hashes:  # nothing computed yet: the prefix cache gives what it holds
            hit = (sim.cached_prompt_tokens(i, r) if i is not None
                   else max(sim.cached_prompt_tokens(j, r) for j in range(m)))
        work = max(0, r.prompt_tokens + gen - comp - hit) * a + max(0, r.output_tokens - gen) * tau
        rows.append((r.arrival_s, work))
    if not rows:
        return 0.0, 0
    arr = np.array(rows)
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    waited = np.sum(end_s - np.maximum(arr[:, 0], now_s))
    return float(waited + np.sum(np.cumsum(arr[:, 1])) / m), len(rows)


def rollout_cost(sim: ClusterSim, now_s: float, horizon_s: float, first_record: int,
                 tau: "float | InstanceCosts | None" = None) -> float:
    """Sum of E2E latency from ``now_s`` of every request in scope of a fork rolled forward to the horizon
    (``tau``: the per-token costs of the estimate, default ``instance_costs(sim)``; a number: one decode
    cost per token for every instance)."""
    return _rollout(sim, now_s, horizon_s, first_record, _as_costs(sim, tau))[0]


def _rollout(sim: ClusterSim, now_s: float, horizon_s: float, first_record: int, costs: InstanceCosts
             ) -> tuple[float, int]:
    """(cost, requests in scope) of a fork rolled forward to ``now_s + horizon_s``."""
    end_s = now_s + horizon_s
    sim.run_until(end_s)
    cost = 0.0
    recs = sim.records
    for k in range(first_record, len(recs)):
        rec = recs[k]
        done_s = rec.finish_s if rec.finish_s is not None else sim.now_s  # a failed request leaves
        cost += done_s - max(rec.arrival_s, now_s)
    n = len(recs) - first_record
    if not sim.done:
        c, m = _unfinished_estimate_s(sim, now_s, end_s, costs)
        cost += c
        n += m
    return cost, n


class GateIdleGuard:
    """The fork dispatcher's epoch guard (``Dispatcher.guard``) for a ``late_binding_srpt`` base: the same
    decisions, without building a view or calling the router when the router would defer anyway. After an
    epoch that ended deferring, the router defers again while the head of the queue, the queue length and
    every instance's outstanding, prefilling and pending-prompt counts are unchanged, within its own
    ``refresh_s`` of its last evaluation and before the head ages past ``max_wait_s``
    (``LateBindingRouter.route``: no open instance, or an unchanged signature within ``refresh_s``). Most of
    a rollout's epochs are such re-offers every Δt; the simulator's own epoch (sends, the next offer's timer)
    is unchanged."""

    __slots__ = ("queue", "state", "router", "refresh_s", "max_wait_s", "last")

    def __init__(self, sim: ClusterSim, router: LateBindingRouter):
        self.queue = sim.dispatcher.queue
        self.state = sim.state
        self.router = router
        self.refresh_s = router.params.refresh_s
        self.max_wait_s = router.params.max_wait_s
        self.last: tuple | None = None  # what the router saw when it last deferred

    def _sig(self) -> tuple:
        queue = self.queue
        return len(queue), queue[0].request_id, self.state.composition()

    def skip(self, now_s: float) -> bool:
        last, queue = self.last, self.queue
        return (last is not None and len(queue) > 0 and now_s - self.router.last_eval_s < self.refresh_s
                and now_s - queue[0].arrival_s < self.max_wait_s and last == self._sig())

    def decided(self, now_s: float) -> None:
        self.last = self._sig() if self.queue else None  # before the sends


def evaluate(sim: ClusterSim, action: Decision | None, *, pending: Sequence[tuple[Request, int]] = (),
             params: LookaheadParams = LookaheadParams(), seed: int = 0, as_base: bool = False) -> float:
    """Cost of taking ``action`` at ``sim``'s current epoch (after the ``pending`` dispatches already decided
    in it) and following a fresh base policy after. ``as_base``: let the base policy make this epoch's
    decision itself (the rollout of the base's own action)."""
    return _evaluate(sim, action, pending, params, seed, as_base, params.horizon_s, instance_costs(sim))[0]


def fork_cost(sim: ClusterSim, action: Decision | None, router: Any, pending: Sequence[tuple[Request, int]],
              horizon_s: float, tau: "float | InstanceCosts | None" = None, as_base: bool = False
              ) -> tuple[float, int]:
    """(cost, requests in scope) of taking ``action`` (None: deferring) at ``sim``'s current epoch after the
    ``pending`` dispatches, then routing with ``router`` to the horizon, on a fork (``sim`` is not advanced).
    ``as_base``: the router decides this epoch too, and ``action`` is ignored. Costed as ``rollout_cost``."""
    fork = sim.clone()
    now = fork.now_s
    first = len(fork.records)
    disp = fork.dispatcher
    out = list(pending)
    fork.set_router(router)  # first: the candidate's dispatch below reaches the router's hooks, not the planner's
    if action is not None and not as_base:
        placed = getattr(router, "placed", None)
        if placed is not None:  # the base's memory learns of the candidate as of its own placements
            placed(disp.queue[action.queue_index], action.instance, now)
        out.append((disp.dispatch(action.queue_index, action.instance, now), action.instance))
    if as_base or action is not None:
        out += disp.decide(now)
    fork.send(out)
    if isinstance(router, LateBindingRouter):
        disp.guard = GateIdleGuard(fork, router)
    return _rollout(fork, now, horizon_s, first, _as_costs(fork, tau))


def _evaluate(sim: ClusterSim, action: Decision | None, pending: Sequence[tuple[Request, int]],
              params: LookaheadParams, seed: int, as_base: bool, horizon_s: float, tau: InstanceCosts,
              live: Any = None) -> tuple[float, int]:
    return fork_cost(sim, action, _base_router(sim, params, seed, live), pending, horizon_s, tau, as_base)


def _base_router(sim: ClusterSim, params: LookaheadParams, seed: int, live: Any) -> Any:
    """The base router a rollout routes with: a copy of the live one (its memory of the run), else a fresh one."""
    if live is not None:
        return copy_router(live, sim)
    return make_base(params.base, sim.num_instances, seed, sim.profile)


def plan_action(sim: ClusterSim, *, reorder: bool = False, horizon_s: float = 5.0, base: str = "gate",
                k: int = 2, pending: Sequence[tuple[Request, int]] = (), seed: int = 0, margin_s: float = 0.05,
                screen_s: float = 1.0, best_of: Sequence[str] | None = None) -> Decision | None:
    """The planner's action at ``sim``'s current decision epoch: ``Decision(queue_index, instance)`` or
    ``None`` (defer). A pure function: ``sim`` is forked, never advanced.

    ``sim`` is a ``ClusterSim`` stopped at a decision epoch (step-wise driving: after ``advance``, with
    requests in ``sim.queue``). ``pending``: dispatches already decided in this epoch and not yet sent (the
    router passes the dispatcher's; a step-wise caller has none). Options as ``LookaheadParams``, except the
    base: ``gate`` (strictly head of line) by default, so that with ``reorder=False`` the action is always the
    head of the queue (a teacher in the paper's action space reads only its instance). ``base="best"`` is
    resolved at every call (``resolve_base``: one episode per base of ``best_of``).
    """
    opts: dict[str, Any] = dict(reorder=reorder, horizon_s=horizon_s, base=base, k=k, margin_s=margin_s,
                                screen_s=screen_s)
    if best_of is not None:
        opts["best_of"] = best_of
    params = parse_params(opts)
    if params.base == "best" and not sim.dispatcher.queue:
        return None
    return _plan(sim, resolve_base(sim, params, seed, pending), pending, seed)[0]


def _margin(params: LookaheadParams, horizon_s: float) -> float:
    """The margin per request in scope at a horizon: none for exact rollouts (nothing estimated)."""
    return params.margin_s if math.isfinite(horizon_s) else 0.0


def _plan(sim: ClusterSim, params: LookaheadParams, pending: Sequence[tuple[Request, int]], seed: int,
          live: Any = None) -> tuple[Decision | None, int, bool]:
    """(best action, number of rollouts, whether it replaced the base policy's own action). ``live``: the base
    router with its memory of the run, copied into every rollout (None: a fresh base each time)."""
    queue = sim.dispatcher.queue
    if not queue:
        return None, 0, False
    tau = instance_costs(sim)  # computed once per simulator; its forks are given it
    view = sim.view(detail=True)
    base_action = _base_router(sim, params, seed, live).route(queue, view, sim.now_s)
    cands = [c for c in _candidates(queue, view, params.reorder, params.k) if c != base_action]
    if not cands:
        return base_action, 0, False
    h = params.horizon_s
    two_stage = 0.0 < params.screen_s < h and math.isfinite(h)
    h1 = params.screen_s if two_stage else h
    base_cost, n_scope = _evaluate(sim, None, pending, params, seed, True, h1, tau, live)
    bar = base_cost - _margin(params, h1) * n_scope
    best, best_cost = base_action, bar
    n = 1
    for cand in cands:
        c = _evaluate(sim, cand, pending, params, seed, False, h1, tau, live)[0]
        n += 1
        if c < best_cost:
            best, best_cost = cand, c
    if best is base_action or not two_stage:
        return best, n, best is not base_action
    base_cost, n_scope = _evaluate(sim, None, pending, params, seed, True, h, tau, live)
    c = _evaluate(sim, best, pending, params, seed, False, h, tau, live)[0]
    n += 2
    if c < base_cost - _margin(params, h) * n_scope:
        return best, n, True
    return base_action, n, False


# ------------------------------------------------------------------------------------------------ the router


@register("lookahead", f"oracle planner: rolls every action forward on a fork of the simulator ({ORACLE_NOTE})")
class LookaheadRouter:
    """See the module docstring. Options as ``LookaheadParams`` (``--router-opt lookahead.reorder=true``)."""

    #: an oracle: reads the simulator (true lengths, future arrivals); live backends refuse it
    needs_simulator = True
    deployable = False

    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None, **options: Any):
        self.params = self.requested = parse_params(options)  # params: with base=best, the base chosen at bind
        check_base(self.params, num_instances, seed, profile)  # fail early on a bad base
        self.base_costs: dict[str, float] = {}  # with base=best: each base's cost when the run was bound
        self.num_instances = num_instances
        self.seed = seed
        self.profile = profile
        self.sim: ClusterSim | None = None
        self.num_plans = 0
        self.num_rollouts = 0
        self.num_replaced = 0  # decisions where a candidate replaced the base policy's own action
        self.live: Any = None  # the base router beside the run, fed its events and placements (bind_simulator)
        self._idle_sig: tuple | None = None
        self._idle_s = -math.inf

    def bind_simulator(self, sim: ClusterSim) -> None:
        """The simulator calls this before a run: the planner forks it at each decision. With ``base=best``
        the base is chosen here, on forks of the simulator run to the end (``resolve_base``)."""
        self.sim = sim
        self._idle_sig = None
        prm = self.requested
        if prm.base == "best":
            self.base_costs = base_costs(sim, prm.best_of, self.seed)
            self.params = replace(prm, base=min(prm.best_of, key=lambda b: self.base_costs[b]))
        self.live = make_base(self.params.base, sim.num_instances, self.seed, sim.profile)
        bind_kv = getattr(self.live, "bind_kv_events", None)
        if bind_kv is not None:  # a precise prefix base indexes the run's KV events
            bind_kv(sim.subscribe_kv_events)

    def on_event(self, ev: Event) -> None:
        """The run's events reach the live base as they would reach it routing alone: a placement first
        (``placed``, what its own ``route`` does), then the event itself."""
        live = self.live
        if live is None:
            return
        if type(ev) is Dispatched:
            placed = getattr(live, "placed", None)
            if placed is not None:
                placed(ev.request, ev.instance, ev.time_s)
        hook = getattr(live, "on_event", None)
        if hook is not None:
            hook(ev)

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        sim = self.sim
        if sim is None:
            raise PlannerError("lookahead is an oracle: it reads true lengths and future arrivals, and runs "
                               "only on the simulator")
        if not queue:
            return None
        prm = self.params
        sig = (queue[0].request_id, tuple((iv.num_outstanding, iv.num_prefilling) for iv in view.instances))
        if sig == self._idle_sig and now_s - self._idle_s < prm.refresh_s:
            return None
        action, n, replaced = _plan(sim, prm, sim.dispatcher.decided, self.seed, self.live)
        self.num_plans += 1
        self.num_rollouts += n
        self.num_replaced += replaced
        if action is None:
            self._idle_sig, self._idle_s = sig, now_s
        else:
            self._idle_sig = None
        return action
