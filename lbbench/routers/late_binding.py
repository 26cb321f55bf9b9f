"""A length-aware, late-binding router: hold requests at the router, release the
smallest predicted job first, bind it where it fits.

Why: under overload a continuously batched instance queues whatever it is sent
in FCFS order and, when its paged KV cache fills, preempts (recomputes) the
newest running request. Routing the head of the queue immediately, as the
paper's routers do, therefore hands the order of service to the instances and
invites KV thrash. This router keeps the queue at the load balancer instead:

1. **Late binding.** A request is bound to an instance only when the instance
   has *headroom* for it: a free sequence slot, little prefill already waiting
   there, and room in the KV cache for the request's predicted final footprint
   (prompt + ``Request.expected_output_tokens``) at the *projected peak* of the
   instance's KV use. The peak is projected from what a client sees
   (``InstanceView.outstanding``): each outstanding request holds its prompt
   plus its generated tokens and grows by one token per step until its
   predicted length, then frees everything. ``kv_slack`` scales the capacity
   (overbooking). Live, without a KV capacity in the spec or profile, the
   engine's own ``/metrics`` usage and waiting count stand in for it. An idle
   instance (nothing outstanding) always takes the next request, so a cautious
   gate can slow the cluster down but never stall it.
2. **Size-aware release order.** Among queued requests the one with the least
   predicted work goes first (``order``; ``hrrn`` ages it by the wait, the
   highest response ratio (wait + service) / service first). Requests that
   fit nowhere are backfilled past. A request that has waited ``max_wait_s``
   is sent at once, past every gate, to the cheapest healthy instance: a
   bound on the wait at the router, not only on being passed over.
3. **Placement.** Among instances with headroom, the least cost: the prefill
   wait (prompt tokens still to prefill there plus this prompt) and the decode
   interference (decoding sequences and their context slowing each of this
   request's decode steps, and this request slowing theirs), weighted by the
   profile's step-time coefficients; ties (within ``tie_s``) are broken by a
   seeded random choice, or ``choices=2`` samples two eligible instances
   (power of two choices).
4. **Calibration.** Completions (``Finished``, observable live too) teach the
   router the ratio of true to predicted length per prediction value; the gate
   plans with a high quantile of it, so a bucket predictor's upper bounds (the
   whole context for its open last bucket) do not leave the cache half empty.

Only ``ClusterView`` and the request are used, so the router runs unchanged in
the simulator, the live harness and against ``lbbench serve-sim``; an instance
marked unhealthy is never chosen, and with no healthy instance it defers.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

import numpy as np

from ..core import ClusterView, Decision, Dispatched, Event, Failed, Finished, InstanceView, Request
from ..profiles import Profile
from .registry import register

#: ``InstanceSpec.kv_capacity_tokens`` at or above this means "unknown" (the
#: default spec of a live endpoint says 2**30).
UNKNOWN_CAPACITY_TOKENS = 1 << 29

ORDERS = ("kv_time", "job_time", "output", "fcfs", "hrrn")

# step-time coefficients used without a profile (Llama-2-7B on a V100)
_DEFAULT_PREFILL_TOKEN_S = 3.2e-4
_DEFAULT_DECODE_SEQ_S = 3.3e-5
_DEFAULT_CONTEXT_TOKEN_S = 1.2e-6
_DEFAULT_STEP_S = 0.02


@dataclass(frozen=True)
class LateBindingParams:
    """Every knob of the router, with its default and why."""

    kv_slack: float = 0.3
    """Fraction of KV capacity the gate may overbook: the projected peak may
    reach ``(1 + kv_slack) x`` capacity (0 = must fit exactly). The projection
    is pessimistic (every outstanding request is assumed to run to its planned
    length, and they all peak together), so an exact fit leaves the cache
    under-used, and a generous one lets the engine's own FCFS admission and
    preemption take over again. Chosen on tuning seeds (4 x V100, paper-mix,
    FCFS engine, against 0.3): 0 cuts preemptions fourfold, is 2 % faster at
    10 req/s and 5 % slower at 20 (the cache idles); 0.5 is 1-6 % slower; 3 is
    17 % slower at 20 req/s (the engine's FCFS admission takes over)."""

    max_wait_s: float = 120.0
    """The wait bound (seconds at the router): a request that has waited this
    long is sent at once, past every gate, to the cheapest healthy instance, so
    no request waits longer at the router while an instance is up (plus one
    decision interval, the profile's ``min_step_s``). The wait moves to the
    engine's queue, where the router no longer orders it, so a bound shorter
    than the overload's queueing delay turns the router FCFS. Chosen on tuning
    seeds (4 x V100, paper-mix, FCFS engine, 20 req/s): with 2000 requests
    (100 s of overload) 120 s is 2 % faster than no bound with a 31 % lower
    p99, while 60 s is 53 % slower (most requests reach the bound); with 1000
    requests 60 s would be 0-4 % faster than 120 s with a lower p99, which is
    why 60 s is not the default. The aging rule that trades mean for tail by
    ordering instead is ``order="hrrn"``."""

    order: str = "job_time"
    """Release order. ``job_time`` (default): shortest predicted service
    first (prefill plus predicted decode seconds at the minimum step), the
    order vLLM's priority policy gives an engine, here across the whole cluster.
    ``hrrn``: the aging rule, highest response ratio next, (wait + service) /
    service: a long request overtakes short ones once it has waited as many
    multiples of its own service time as they have of theirs. On tuning seeds
    it cuts p99 E2E by 29 % at 10 req/s (81.9 -> 57.9 s) and 11 % at 20 req/s
    at a cost of 8-9 % of mean E2E. Other static orders: ``kv_time`` (predicted
    KV-token-steps, output x (prompt + output/2)), ``output`` (predicted output
    tokens), both within 1 % of ``job_time``; ``fcfs``."""

    max_output_tokens: int | None = None
    """Cap on a prediction used by the gate (default: what fits the KV cache
    beside the prompt, since longer requests are rejected by the engine)."""

    overrun_tokens: int = 32
    """Decode tokens still expected from a request that has already produced
    its predicted length (the prediction was low): a short extension, re-judged
    at every step, rather than 'finishing now'."""

    max_prefill_tokens: int | None = None
    """Prompt tokens that may wait for prefill on one instance before it stops
    taking requests (default: the profile's ``max_num_batched_tokens``, one
    engine step's worth): more would only queue at the instance, in FCFS order,
    where the router can no longer reorder them."""

    seq_fill: float = 1.0
    """Fraction of ``max_num_seqs`` the router fills per instance; beyond it
    requests would wait in the engine's queue instead of the router's."""

    max_kv_usage: float = 0.95
    """Live fallback (no KV capacity known): an instance whose scraped
    ``/metrics`` KV usage is above this is closed to new requests."""

    metrics_max_age_s: float = 2.0
    """A ``/metrics`` sample older than this is ignored by the live fallback."""

    prefill_weight: float = 1.0
    """Weight of the prefill wait (seconds) in the placement cost."""

    decode_weight: float = 1.0
    """Weight of the decode interference (seconds) in the placement cost."""

    choices: int = 0
    """0: the cheapest eligible instance, ties broken at random; k >= 2: sample
    k eligible instances (power of k choices) and take the cheaper."""

    tie_s: float = 1e-3
    """Placement costs within this many seconds of the best count as a tie."""

    refresh_s: float = 0.2
    """While nothing observable changes (no arrival, dispatch, first token or
    completion) a deferral is repeated without re-evaluating the gates for up
    to this long; requests grow a token per step, which moves the projected
    peak only slowly."""

    backfill_depth: int = 16
    """How many queued requests, in release order, are tried per decision when
    the first does not fit: the first few catch nearly every request that fits
    (the paper setup's mean E2E is the same at 16 and 256), and the depth bounds
    the cost of a decision at long queues."""

    calibrate: bool = True
    """Learn, from the requests that finish, what each predicted length really
    turns out to be, and let the gate plan with that (the prediction times the
    ``plan_quantile`` of true / predicted seen for the same prediction value)
    instead of the raw prediction.
    Bucket predictors report a bucket's upper bound, e.g. the whole context for
    the open last bucket, which would make every such request wait for an empty
    instance. Completions are observable live too (``Finished``)."""

    plan_quantile: float = 0.75
    """Quantile of the observed true / predicted ratios the gate plans with:
    above the median, so a batch of requests with the same prediction rarely
    outgrows the cache, below the maximum, which one outlier would set."""

    min_samples: int = 20
    """Completions needed for a prediction value before it is calibrated."""

    window: int = 256
    """Most recent completions kept per prediction value (tracks drift)."""

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"late binding: order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.kv_slack < -0.5:
            raise ValueError("late binding: kv_slack must be >= -0.5")
        if self.max_wait_s <= 0:
            raise ValueError("late binding: max_wait_s must be > 0 (use order='fcfs' for FCFS)")
        if not 0 < self.seq_fill <= 1:
            raise ValueError("late binding: seq_fill must be in (0, 1]")
        if self.choices < 0 or self.choices == 1:
            raise ValueError("late binding: choices must be 0 or >= 2")
        if not 0 < self.plan_quantile <= 1:
            raise ValueError("late binding: plan_quantile must be in (0, 1]")
        if self.backfill_depth < 1 or self.overrun_tokens < 1 or self.min_samples < 1 or self.window < 1:
            raise ValueError("late binding: backfill_depth, overrun_tokens, min_samples and window must be >= 1")


def clamp_output(output_tokens: int, prompt_tokens: int, cap: float) -> int:
    """A planned output length cut to what fits the KV cache beside the prompt
    (the engine rejects longer requests, so none can grow past that)."""
    if math.isfinite(cap):
        output_tokens = min(output_tokens, int(cap) - prompt_tokens)
    return max(1, output_tokens)


class Calibration:
    """How the true output length relates to the predicted one, learned from
    finished requests: the ratio true / predicted, kept per prediction value
    (a bucket predictor has a handful; point predictions are binned by powers
    of two). An exact predictor keeps a ratio of 1; a bucket predictor that
    reports upper bounds learns how far below them requests really end."""

    def __init__(self, quantile: float, min_samples: int, window: int):
        self.quantile = quantile
        self.min_samples = min_samples
        self.window = window
        self._recent: dict[int, list[float]] = {}  # key -> ratios, oldest first
        self._ratio: dict[int, float] = {}  # key -> cached quantile
        self.version = 0  # bumped whenever a plan may change

    @staticmethod
    def key(predicted_tokens: int) -> int:
        return 1 << max(0, predicted_tokens.bit_length() - 1)

    def observe(self, predicted_tokens: int, true_tokens: int) -> None:
        k = self.key(predicted_tokens)
        xs = self._recent.setdefault(k, [])
        xs.append(true_tokens / max(1, predicted_tokens))
        if len(xs) > self.window:
            del xs[0]
        if k in self._ratio or len(xs) == self.min_samples:
            self._ratio.pop(k, None)
            self.version += 1

    def ratio(self, predicted_tokens: int) -> float:
        """The ``quantile`` of true / predicted for this prediction (1 until
        there are ``min_samples`` of them)."""
        k = self.key(predicted_tokens)
        got = self._ratio.get(k)
        if got is None:
            xs = self._recent.get(k)
            if xs is None or len(xs) < self.min_samples:
                return 1.0
            srt = sorted(xs)
            got = self._ratio[k] = srt[min(len(srt) - 1, int(self.quantile * len(srt)))]
        return got

    def planned(self, predicted_tokens: int) -> int:
        return max(1, math.ceil(predicted_tokens * self.ratio(predicted_tokens)))


class KvGate:
    """One instance's headroom for a decision: the projected KV curve of its
    outstanding requests, evaluated at the points where a request finishes."""

    __slots__ = ("index", "idle", "cap", "limit", "ends", "tail_ctx", "prefix", "sum_final", "now_kv",
                 "view")

    def __init__(self, iv: InstanceView, cap: float, limit: float, plan: Callable[[Request], int],
                 overrun: int):
        self.index = iv.index
        self.view = iv
        self.idle = iv.num_outstanding == 0
        self.cap = cap
        self.limit = limit
        rows = []
        sum_final = 0
        now_kv = 0
        if math.isfinite(limit) and not self.idle:
            for o in iv.outstanding:
                r = o.request
                ctx = r.prompt_tokens + o.generated_tokens
                final = r.prompt_tokens + clamp_output(plan(r), r.prompt_tokens, cap)
                rem = max(final - ctx, overrun)
                rows.append((rem, ctx))
                sum_final += ctx + rem
                now_kv += ctx
        rows.sort()
        n = len(rows)
        self.ends = [rem for rem, _ in rows]
        # tail_ctx[m]: KV held now by the requests that outlive rows[m-1]
        tail_ctx = [0] * (n + 1)
        for m in range(n - 1, -1, -1):
            tail_ctx[m] = tail_ctx[m + 1] + rows[m][1]
        self.tail_ctx = tail_ctx
        # The existing load holds U(k) = sum over rem_j > k of (ctx_j + k) at step k; it
        # grows between finishes, so its maxima are just before each finish, at
        # k = rem_m - 1, where rows m.. are still running. A new request (p, d)
        # adds p + k while k < d. ``prefix[m]``: the largest p allowed by the
        # breakpoints of rows 0..m-1 (all of them before the new request ends).
        prefix = [limit - now_kv] * (n + 1)
        for m in range(n):
            k = rows[m][0] - 1
            prefix[m + 1] = min(prefix[m], limit - (tail_ctx[m] + (n - m) * k) - k)
        self.prefix = prefix
        self.sum_final = sum_final
        self.now_kv = now_kv

    def max_prompt_tokens(self, output_tokens: int) -> float:
        """Largest prompt of a request with ``output_tokens`` predicted output that
        keeps the projected peak within the limit (monotone: more output, less prompt)."""
        if self.idle or not math.isfinite(self.limit):
            return math.inf
        d = max(1, output_tokens)
        m = bisect.bisect_right(self.ends, d)  # rows finishing while it runs: rem - 1 < d
        k = d - 1  # its own last step
        n = len(self.ends)
        return min(self.prefix[m], self.limit - (self.tail_ctx[m] + (n - m) * k) - k)

    def fits(self, prompt_tokens: int, output_tokens: int) -> bool:
        """Would the projected peak, with this request added now, stay within the limit?"""
        return prompt_tokens <= self.max_prompt_tokens(output_tokens)


@register("late_binding_srpt", "holds requests until an instance has KV headroom for their predicted "
          "footprint; shortest predicted job first; no request waits longer than max_wait_s")
class LateBindingRouter:
    """See the module docstring. ``params`` may be given as keyword arguments
    (``kv_slack=0.1``) or as a ``LateBindingParams``."""

    needs_detail = True

    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 params: LateBindingParams | None = None, **options: Any):
        known = {f.name for f in fields(LateBindingParams)}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"late binding: unknown option(s) {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(sorted(known))})")
        base = params or LateBindingParams()
        self.params = LateBindingParams(**{**{f.name: getattr(base, f.name) for f in fields(base)},
                                           **options})
        self.num_instances = num_instances
        self.seed = seed
        self.profile = profile
        p = profile
        self._a = p.prefill_token_s if p else _DEFAULT_PREFILL_TOKEN_S
        self._b = p.decode_seq_s if p else _DEFAULT_DECODE_SEQ_S
        self._c = p.context_token_s if p else _DEFAULT_CONTEXT_TOKEN_S
        self._step = p.min_step_s if p else _DEFAULT_STEP_S
        self._max_prefill = (self.params.max_prefill_tokens if self.params.max_prefill_tokens is not None
                             else (p.max_num_batched_tokens if p else 2048))
        self.reset(seed)

    @property
    def last_eval_s(self) -> float:
        """When the router last evaluated its gates (a deferral stands ``refresh_s`` from then unless the
        cluster changes)."""
        return self._last_eval_s

    # ------------------------------------------------------------------ bookkeeping
    def reset(self, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(self.seed if seed is None else seed)
        self._sorted: list[tuple[float, float, int]] = []  # (priority, arrival, request_id)
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None  # hrrn: arrival, service
        self._by_id: dict[int, Request] = {}
        self._idle_sig: tuple | None = None
        self._last_eval_s = -math.inf
        prm = self.params
        self.calibration = Calibration(prm.plan_quantile, prm.min_samples, prm.window)
        self._predicted: dict[int, int] = {}  # dispatched request -> its prediction
        self._plan_cache: dict[int, tuple[int, int]] = {}  # request -> (calibration version, plan)
        self.num_aged_releases = 0

    def priority(self, r: Request) -> float:
        """Predicted work of a request under the configured order (smaller goes first)."""
        d = r.expected_output_tokens
        order = self.params.order
        if order == "kv_time":
            return d * (r.prompt_tokens + 0.5 * d) + r.prompt_tokens
        if order == "job_time":
            return r.prompt_tokens * self._a + d * self._step
        if order == "output":
            return float(d)
        if order == "hrrn":  # the service time; the order itself depends on the wait
            return max(self._step, r.prompt_tokens * self._a + d * self._step)
        return r.arrival_s

    def planned_output_tokens(self, r: Request) -> int:
        """Output length the gate plans for (before fitting it to the cache)."""
        cal = self.calibration
        hit = self._plan_cache.get(r.request_id)
        if hit is not None and hit[0] == cal.version:
            return hit[1]
        d = r.expected_output_tokens
        if self.params.calibrate:
            d = cal.planned(d)
        if self.params.max_output_tokens is not None:
            d = min(d, self.params.max_output_tokens)
        if len(self._plan_cache) > 65536:
            self._plan_cache.clear()
        self._plan_cache[r.request_id] = (cal.version, d)
        return d

    def on_event(self, event: Event) -> None:
        """Dispatches and completions feed the calibration of predictions."""
        if isinstance(event, Dispatched):
            self._predicted[event.request.request_id] = event.request.expected_output_tokens
        elif isinstance(event, Finished):
            pred = self._predicted.pop(event.request_id, None)
            if pred is not None:
                self.calibration.observe(pred, event.output_tokens)
        elif isinstance(event, Failed):
            self._predicted.pop(event.request_id, None)

    def _sync(self, queue: Sequence[Request]) -> None:
        """Mirror the dispatcher's queue in ``_sorted``. Requests only join at the
        end of the queue and leave by our own decisions; anything else (a live
        run failing queued requests) triggers a rebuild."""
        n_known = len(self._by_id)
        if len(queue) >= n_known and (n_known == 0 or queue[n_known - 1].request_id in self._by_id):
            for r in queue[n_known:]:
                if r.request_id in self._by_id:
                    break
                self._add(r)
            else:
                return
        self._sorted.clear()
        self._arrays = None
        self._by_id.clear()
        for r in queue:
            self._add(r)

    def _candidates(self, now_s: float) -> list[tuple[int, int]]:
        """(position in ``_sorted``, request id) of the first ``backfill_depth``
        requests in release order."""
        depth = self.params.backfill_depth
        if self.params.order != "hrrn":
            return [(pos, e[2]) for pos, e in enumerate(self._sorted[:depth])]
        # highest response ratio (wait + service) / service first: short jobs
        # first, but a long one's ratio grows with its wait at a rate set by the
        # load itself (how long the short ones wait), not by a fixed bound
        if self._arrays is None:
            srt = self._sorted
            self._arrays = (np.fromiter((e[1] for e in srt), float, len(srt)),
                            np.fromiter((e[0] for e in srt), float, len(srt)))
        arrival, service = self._arrays
        score = (arrival - now_s) / service  # -(wait / service): smallest first
        if len(score) > depth:
            top = np.argpartition(score, depth - 1)[:depth]
            top = top[np.argsort(score[top], kind="stable")]
        else:
            top = np.argsort(score, kind="stable")
        srt = self._sorted
        return [(int(k), srt[int(k)][2]) for k in top]

    def _add(self, r: Request) -> None:
        self._arrays = None
        self._by_id[r.request_id] = r
        bisect.insort(self._sorted, (self.priority(r), r.arrival_s, r.request_id))

    def _take(self, queue: Sequence[Request], r: Request, pos: int | None, instance: int) -> Decision:
        if pos is None:
            pos = next(k for k, e in enumerate(self._sorted) if e[2] == r.request_id)
        del self._sorted[pos]
        self._arrays = None
        del self._by_id[r.request_id]
        self._idle_sig = None
        for k, x in enumerate(queue):  # by identity: Request equality compares every field
            if x is r:
                return Decision(k, instance)
        return Decision(queue.index(r), instance)

    # ------------------------------------------------------------------ gates
    def _capacity(self, iv: InstanceView) -> float:
        cap = iv.spec.kv_capacity_tokens
        if cap < UNKNOWN_CAPACITY_TOKENS:
            return float(cap)
        if self.profile is not None:
            return float(self.profile.kv_capacity_tokens)
        return math.inf

    def _open(self, iv: InstanceView, now_s: float) -> bool:
        """Sequence, prefill-queue and (live fallback) metrics gates."""
        if iv.num_outstanding == 0:
            return True
        max_seqs = iv.spec.max_num_seqs
        if self.profile is not None:
            max_seqs = min(max_seqs, self.profile.max_num_seqs)
        if iv.num_outstanding >= max(1, int(max_seqs * self.params.seq_fill)):
            return False
        if iv.prompt_tokens_pending >= self._max_prefill:
            return False
        m = iv.metrics
        if (m is not None and not math.isfinite(self._capacity(iv))
                and now_s - m.time_s <= self.params.metrics_max_age_s):
            if m.kv_usage > self.params.max_kv_usage or m.num_waiting > 0:
                return False
        return True

    def _eligible(self, r: Request, gates: list[KvGate]) -> list[KvGate]:
        d = self.planned_output_tokens(r)
        p = r.prompt_tokens
        return [g for g in gates if g.fits(p, clamp_output(d, p, g.cap))]

    # ------------------------------------------------------------------ placement
    def cost_s(self, iv: InstanceView, prompt_tokens: int, output_tokens: int) -> float:
        """Placement cost (seconds): prefill wait plus decode interference."""
        prefill = self._a * (iv.prompt_tokens_pending + prompt_tokens)
        d = output_tokens
        # each of this request's d steps is slowed by the co-running decodes and
        # their context; each co-runner is slowed while they overlap
        shared = min(iv.num_outstanding * d, max(0, iv.predicted_tokens_remaining))
        decode = d * (self._b * iv.num_decoding + self._c * iv.context_tokens) + self._b * shared
        return self.params.prefill_weight * prefill + self.params.decode_weight * decode

    def _place(self, r: Request, ivs: list[InstanceView]) -> int:
        p, d = r.prompt_tokens, self.planned_output_tokens(r)
        if self.params.choices >= 2 and len(ivs) > self.params.choices:
            pick = self._rng.choice(len(ivs), size=self.params.choices, replace=False)
            ivs = [ivs[int(k)] for k in sorted(pick)]
        costs = [self.cost_s(iv, p, d) for iv in ivs]
        best = min(costs)
        tied = [iv.index for iv, c in zip(ivs, costs) if c <= best + self.params.tie_s]
        return tied[0] if len(tied) == 1 else int(tied[int(self._rng.integers(len(tied)))])

    # ------------------------------------------------------------------ routing
    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        if not queue:
            return None
        healthy = [iv for iv in view.instances if iv.healthy]
        if not healthy:
            return None
        self._sync(queue)
        prm = self.params
        head = queue[0]
        if now_s - head.arrival_s >= prm.max_wait_s:
            # the bound: the oldest request goes now, past every gate, to the
            # cheapest healthy instance (it queues there, no longer here)
            self.num_aged_releases += 1
            return self._take(queue, head, None, self._place(head, healthy))
        open_ivs = [iv for iv in healthy if self._open(iv, now_s)]
        if not open_ivs:
            return None
        # nothing changed since the last deferral (no arrival, dispatch, first
        # token or completion): the answer is still "defer" unless aging kicks in
        sig = (len(queue),
               tuple((iv.index, iv.num_outstanding, iv.num_prefilling) for iv in open_ivs))
        if sig == self._idle_sig and now_s - self._last_eval_s < prm.refresh_s:
            return None
        self._last_eval_s = now_s
        plan = self.planned_output_tokens
        gates = []
        for iv in open_ivs:
            cap = self._capacity(iv)
            gates.append(KvGate(iv, cap, cap * (1.0 + prm.kv_slack), plan, prm.overrun_tokens))

        # backfill in release order; the largest prompt any gate admits for a given
        # output length is computed once per length (it is what every candidate needs)
        uniform = all(g.cap == gates[0].cap for g in gates)
        room: dict[int, float] = {}
        for pos, rid in self._candidates(now_s):
            r = self._by_id[rid]
            if uniform:
                d = clamp_output(plan(r), r.prompt_tokens, gates[0].cap)
                best = room.get(d)
                if best is None:
                    best = room[d] = max(g.max_prompt_tokens(d) for g in gates)
                if r.prompt_tokens > best:
                    continue
            eligible = self._eligible(r, gates)
            if eligible:
                return self._take(queue, r, pos, self._place(r, [g.view for g in eligible]))
        self._idle_sig = sig
        return None
