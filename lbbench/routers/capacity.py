"""Capacity-aware routers: for fleets whose instances differ in speed (an L4 beside an H100, TP 1 beside TP 2).

Each one is the speed-aware form of a load-blind heuristic and reads an instance's speed only from
``InstanceView.spec`` (``batch_decode_tokens_per_s``, ``prefill_tokens_per_s``, ``min_step_s``: what a
deployment knows from the instance's profile or measures), never from a profile. On a fleet of identical
instances each behaves as its blind form:

- ``weighted_round_robin`` as ``round_robin``, sending each instance a share proportional to its speed;
- ``jsq_speed`` as ``least_requests``: fewest ``(outstanding + 1) / speed``;
- ``least_work_speed`` as ``jsq``: earliest drain of the instance's predicted work with the request's own;
- ``min_min_speed`` as ``min_min``: Min-Min with each instance's own job times.

Like the heuristics they route the head of the queue (``min_min_speed`` any queued request) at once and
defer only when every instance is down.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core import ClusterView, Decision, InstanceSpec, InstanceView, Request
from .heuristics import _Base, ready_after_s
from .registry import register


def drain_time_s(iv: InstanceView, prompt_tokens: int = 0, output_tokens: int = 0) -> float:
    """Seconds an instance needs for its pending prompts and predicted decode tokens, plus a request of
    ``prompt_tokens`` and ``output_tokens``, each phase at the instance's own throughput."""
    spec = iv.spec
    return ((iv.prompt_tokens_pending + prompt_tokens) / spec.prefill_tokens_per_s
            + (max(0, iv.predicted_tokens_remaining) + output_tokens) / spec.batch_decode_tokens_per_s)


def ready_time_s(iv: InstanceView) -> float:
    """When an instance is expected to be free, as ``heuristics.ready_time_s`` estimates it, with the
    instance's own prefill rate and minimum step (``InstanceSpec``)."""
    return ready_after_s(iv, 1.0 / iv.spec.prefill_tokens_per_s, iv.spec.min_step_s)


def job_time_s(request: Request, spec: InstanceSpec) -> float:
    """A request's serial service time on one instance: its prompt at the instance's prefill rate, its
    predicted output at the instance's minimum step per token (``priority.job_time_s`` per instance)."""
    return request.prompt_tokens / spec.prefill_tokens_per_s + request.expected_output_tokens * spec.min_step_s


@register("weighted_round_robin", "smooth weighted round robin (nginx's), weights = each instance's decode speed")
class WeightedRoundRobin(_Base):
    """Smooth weighted round robin as nginx implements it (``ngx_http_upstream_get_peer`` in
    ``src/http/ngx_http_upstream_round_robin.c``): each pick adds every healthy instance's weight to its
    current weight, takes the largest current weight (the first on a tie) and subtracts the total weight
    from it. Weights 3 and 1 give 0, 0, 1, 0. The weight is ``spec.batch_decode_tokens_per_s``."""

    def __init__(self, num_instances: int, seed: int = 0, **kw: Any):
        super().__init__(num_instances, seed, **kw)
        self._current: list[float] = []

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self._current = []

    def pick(self, request: Request, view: ClusterView) -> int | None:
        if len(self._current) != len(view.instances):
            self._current = [0.0] * len(view.instances)
        cur = self._current
        best, total = None, 0.0
        for iv in view.instances:
            if not iv.healthy:
                continue
            w = iv.spec.batch_decode_tokens_per_s
            cur[iv.index] += w
            total += w
            if best is None or cur[iv.index] > cur[best]:
                best = iv.index
        if best is not None:
            cur[best] -= total
            self._last = best
        return best


@register("jsq_speed", "shortest expected delay: fewest (outstanding requests + 1) / decode speed "
          "(least_requests normalised by speed)")
class JsqSpeed(_Base):
    """Join the shortest queue normalised by speed, the shortest-expected-delay rule (the Linux Virtual
    Server's ``sed`` scheduler, ``net/netfilter/ipvs/ip_vs_sed.c``: ``(active + 1) / weight``): the
    expected completion time of an instance's queue with the new request, counted in requests. Needs no
    length predictions."""

    def cost(self, iv: InstanceView) -> float:
        return (iv.num_outstanding + 1) / iv.spec.batch_decode_tokens_per_s


@register("least_work_speed", "earliest drain of pending prompt + predicted decode tokens, the request's "
          "own included, at each instance's prefill and decode speed (jsq normalised by speed)")
class LeastWorkSpeed(_Base):
    """Least outstanding work in seconds: ``drain_time_s`` of the instance's pending prompt tokens and
    predicted decode tokens left, with the request's own, each phase at the instance's throughput."""

    def pick(self, request: Request, view: ClusterView) -> int | None:
        p, o = request.prompt_tokens, request.expected_output_tokens
        return self._argmin(view, lambda iv: drain_time_s(iv, p, o))

    def scores(self, request: Request, view: ClusterView) -> list[float] | None:
        """Per instance, the drain time ``pick`` minimises (inf: unhealthy)."""
        p, o = request.prompt_tokens, request.expected_output_tokens
        return [drain_time_s(iv, p, o) if iv.healthy else float("inf") for iv in view.instances]


@register("min_min_speed", "Min-Min over the queue with each instance's own speed: the request and instance "
          "with the earliest expected completion (ready time + the request's time there)")
class MinMinSpeed(_Base):
    """Min-Min (Ibarra and Kim, 1977; Braun et al., 2001) on unrelated machines: the completion time of
    queued request ``j`` on instance ``i`` is ``ready_time_s(i) + job_time_s(j, spec_i)``; the pair with the
    smallest goes first (ties: the older request, then the instance after the last one chosen)."""

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        n = len(view.instances)
        rows = []  # (ready_s, prefill_tokens_per_s, min_step_s, index) in tie-break order
        for k in range(1, n + 1):
            iv = view.instances[(self._last + k) % n]
            if iv.healthy:
                rows.append((ready_time_s(iv), iv.spec.prefill_tokens_per_s, iv.spec.min_step_s, iv.index))
        if not rows:
            return None
        best_q, best_i, best_s = 0, rows[0][3], float("inf")
        for q, r in enumerate(queue):
            p, o = r.prompt_tokens, r.expected_output_tokens
            for ready_s, prefill_tps, step_s, i in rows:
                c = ready_s + p / prefill_tps + o * step_s  # ready_time_s + job_time_s, inlined
                if c < best_s:
                    best_q, best_i, best_s = q, i, c
        self._last = best_i
        return Decision(best_q, best_i)
