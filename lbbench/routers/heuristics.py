"""Heuristic routers: the paper's baselines and common production policies.

All of them route the head of the queue immediately (never defer unless every
instance is down) and only look at what a client can observe (``ClusterView``)
plus the request's predicted output length (``Request.expected_output_tokens``,
the true length when no predictor annotated it). Ties break towards the
instance after the last one chosen, so equal instances share load in turn.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..core import ClusterView, Decision, InstanceView, Request
from ..profiles import Profile
from ..priority import job_time_s
from .registry import register

#: the paper's "heavy decode": >= 5 s of decoding at the profile's minimum step
HEAVY_DECODE_S = 5.0


class _Base:
    name = "base"

    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None, **_: Any):
        self.num_instances = num_instances
        self.seed = seed
        self.profile = profile
        self._last = -1

    def reset(self, seed: int | None = None) -> None:
        self._last = -1

    def _argmin(self, view: ClusterView, cost: Callable[[InstanceView], float]) -> int | None:
        """Healthy instance with the lowest cost; ties go round robin after the last pick."""
        best, best_cost = None, float("inf")
        n = len(view.instances)
        for k in range(1, n + 1):
            iv = view.instances[(self._last + k) % n]
            if not iv.healthy:
                continue
            c = cost(iv)
            if c < best_cost:
                best, best_cost = iv.index, c
        if best is not None:
            self._last = best
        return best

    def placed(self, request: Request, instance: int, now_s: float) -> None:
        """``request`` goes to ``instance`` now: what the router remembers of a placement. A router's own ``route``
        makes it for its own decisions; a planner (``lookahead``) makes it on a copy it keeps beside the run, for the
        placements the planner decided. Here: the tie rotation continues after ``instance``."""
        self._last = instance

    def cost(self, iv: InstanceView) -> float:
        """Load figure of one instance; the default ``pick`` takes the lowest."""
        raise NotImplementedError

    def pick(self, request: Request, view: ClusterView) -> int | None:
        return self._argmin(view, self.cost)

    def scores(self, request: Request, view: ClusterView) -> list[float] | None:
        """Per instance, what ``pick`` minimises (``cost``; inf: unhealthy), read without changing the router;
        None when the router has no such figure (decision traces, ``lbbench.experiment.decisions``)."""
        if type(self).cost is _Base.cost or type(self).pick is not _Base.pick:
            return None
        return [self.cost(iv) if iv.healthy else float("inf") for iv in view.instances]

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        inst = self.pick(queue[0], view)
        return None if inst is None else Decision(0, inst)


@register("round_robin", "cycles through the instances in order (the paper's baseline)")
class RoundRobin(_Base):
    def pick(self, request: Request, view: ClusterView) -> int | None:
        n = len(view.instances)
        for k in range(1, n + 1):
            i = (self._last + k) % n
            if view.instances[i].healthy:
                self._last = i
                return i
        return None


class _Seeded(_Base):
    """A router with its own seeded random stream (reset restarts it)."""

    def __init__(self, num_instances: int, seed: int = 0, **kw: Any):
        super().__init__(num_instances, seed, **kw)
        self._rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self._rng = np.random.default_rng(self.seed if seed is None else seed)


@register("random", "uniformly random instance (seeded)")
class RandomRouter(_Seeded):
    def pick(self, request: Request, view: ClusterView) -> int | None:
        healthy = view.healthy_indices()
        return int(healthy[self._rng.integers(len(healthy))]) if healthy else None


@register("least_requests", "fewest outstanding requests (common production default)")
class LeastRequests(_Base):
    def cost(self, iv: InstanceView) -> float:
        return iv.num_outstanding


@register("power_of_two", "two random instances, the one with fewer outstanding requests")
class PowerOfTwo(_Seeded):
    def pick(self, request: Request, view: ClusterView) -> int | None:
        healthy = view.healthy_indices()
        if len(healthy) <= 1:
            return healthy[0] if healthy else None
        a, b = self._rng.choice(len(healthy), size=2, replace=False)
        ia, ib = view.instances[healthy[a]], view.instances[healthy[b]]
        return ia.index if ia.num_outstanding <= ib.num_outstanding else ib.index


@register("jsq", "join the shortest queue: fewest prompt + predicted decode tokens left")
class JoinShortestQueue(_Base):
    def cost(self, iv: InstanceView) -> float:
        return iv.work_tokens


@register("decode_balancer", "balances the sum of predicted decode tokens left")
class DecodeBalancer(_Base):
    def cost(self, iv: InstanceView) -> float:
        return iv.predicted_tokens_remaining


@register("mcu", "maximum capacity usage: the instance with the most free KV capacity")
class MaxCapacity(_Base):
    def cost(self, iv: InstanceView) -> float:
        # KV tokens a client expects in use: decoding context plus prompts about to be prefilled
        return (iv.context_tokens + iv.prompt_tokens_pending) / max(1, iv.spec.kv_capacity_tokens)


def ready_time_s(iv: InstanceView, profile: Profile | None) -> float:
    """When an instance is expected to be free: its outstanding prefill plus the
    decode tokens left, spread over its batch (a client-side estimate), at the
    profile's prefill cost per token and minimum step."""
    return ready_after_s(iv, profile.prefill_token_s if profile else 2e-4, profile.min_step_s if profile else 0.02)


def ready_after_s(iv: InstanceView, prefill_s_per_token: float, step_s: float) -> float:
    """``ready_time_s`` with the costs given: pending prompt tokens at ``prefill_s_per_token``, then the
    decode tokens left at ``step_s`` per token, spread over the running batch."""
    parallel = max(1, min(iv.num_outstanding, iv.spec.max_num_seqs))
    return iv.prompt_tokens_pending * prefill_s_per_token + max(0, iv.predicted_tokens_remaining) * step_s / parallel


@register("min_min", "Min-Min: shortest queued job (prompt + predicted decode) to the earliest-available instance")
class MinMin(_Base):
    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        if len(queue) == 1:
            qi = 0
        else:
            qi = min(range(len(queue)), key=lambda k: (job_time_s(queue[k], self.profile), k))
        inst = self._argmin(view, lambda iv: ready_time_s(iv, self.profile))
        return None if inst is None else Decision(qi, inst)


@register("dedicated_small_large", "half the instances serve heavy decodes (>= 5 s), half light ones")
class DedicatedSmallLarge(_Base):
    def pick(self, request: Request, view: ClusterView) -> int | None:
        n = len(view.instances)
        step = self.profile.min_step_s if self.profile else 0.02
        heavy = request.expected_output_tokens * step >= HEAVY_DECODE_S
        split = max(1, n // 2)
        group = range(split, n) if heavy and n > 1 else range(0, split)
        best, best_n = None, None
        for i in group:
            iv = view.instances[i]
            if iv.healthy and (best_n is None or iv.num_outstanding < best_n):
                best, best_n = i, iv.num_outstanding
        if best is None:  # the whole group is down: fall back to any healthy instance
            return self._argmin(view, lambda iv: iv.num_outstanding)
        return best
