"""Cache-aware routers as production gateways run them.

- ``cache_aware`` follows SGLang's router (``--policy cache_aware``): an
  approximate radix tree per worker of the prompts sent there; when load is
  balanced, the worker with the longest prefix match if its match rate exceeds
  ``cache_threshold``, else the worker with the smallest tree (most room);
  when load is imbalanced (``max - min > balance_abs_threshold`` and
  ``max > balance_rel_threshold * min``, load = requests in flight), the least
  loaded worker. Every ``eviction_interval_s`` each tree is cut to
  ``max_tree_size`` (LRU). Defaults are SGLang's documented ones (0.5, 32,
  1.0001, 60 s, 2**24); SGLang counts the tree in characters, lbbench in tokens.
- ``prefix_load`` follows llm-d's scheduler: a weighted sum of scorers, each in
  [0, 1] per endpoint: prefix-cache (share of the prompt's blocks the endpoint
  was sent before; an LRU per endpoint the size of its KV cache), queue
  (waiting requests, min-max normalised, fewer is better) and KV-cache
  utilization (1 - usage). Weights 3 / 2 / 2 as llm-d's inference-scheduling
  configuration.
- ``session_affinity``: every turn of a session goes where its first turn went
  (the least loaded instance then); requests without a session go to the least
  loaded instance.

Cache hits are estimated from what the router sent (``PrefixTrees``), never
read from an instance.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core import ClusterView, Decision, InstanceView, Request
from ..profiles import Profile
from .heuristics import _Base
from .prefix_tree import PrefixTrees, lru_bound
from .registry import register


@register("cache_aware", "SGLang's cache-aware policy: prefix match above a threshold, else the smallest tree; "
                         "least loaded when load is imbalanced")
class CacheAware(_Base):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 cache_threshold: float = 0.5, balance_abs_threshold: int = 32,
                 balance_rel_threshold: float = 1.0001, eviction_interval_s: float = 60.0,
                 max_tree_size: int = 2 ** 24, **kw: Any):
        super().__init__(num_instances, seed, profile, **kw)
        if not 0 <= cache_threshold <= 1:
            raise ValueError(f"cache_aware: cache_threshold must be in [0, 1], got {cache_threshold}")
        self.cache_threshold = float(cache_threshold)
        self.balance_abs_threshold = int(balance_abs_threshold)
        self.balance_rel_threshold = float(balance_rel_threshold)
        self.eviction_interval_s = float(eviction_interval_s)
        self.trees = PrefixTrees(num_instances, int(max_tree_size))
        self._next_eviction_s = self.eviction_interval_s

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        if now_s >= self._next_eviction_s:  # SGLang's periodic eviction thread
            for i in range(self.num_instances):
                self.trees.evict(i)
            self._next_eviction_s = now_s + self.eviction_interval_s
        healthy = [iv for iv in view.instances if iv.healthy]
        if not healthy:
            return None
        r = queue[0]
        loads = [iv.num_outstanding for iv in healthy]
        lo, hi = min(loads), max(loads)
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            inst = self._argmin(view, lambda iv: iv.num_outstanding)
        else:
            best, best_rate = None, -1.0
            for iv in healthy:
                rate = self.trees.match_tokens(iv.index, r) / max(1, r.prompt_tokens)
                if rate > best_rate:
                    best, best_rate = iv.index, rate
            if best_rate > self.cache_threshold:
                inst = best
            else:
                inst = self._argmin(view, lambda iv: self.trees.tokens[iv.index])
        assert inst is not None
        self.placed(r, inst, now_s)
        return Decision(0, inst)

    def placed(self, request: Request, instance: int, now_s: float) -> None:
        """The radix tree of ``instance`` takes the prompt (SGLang evicts on its own timer, not here). The tie
        rotation moves only when the least-loaded pick chose (``_argmin``), as before."""
        self.trees.insert(instance, request, evict=False)


@register("prefix_load", "llm-d-style scorers: 3 x prefix-cache match + 2 x queue + 2 x KV-cache headroom")
class PrefixLoad(_Base):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 prefix_weight: float = 3.0, queue_weight: float = 2.0, kv_weight: float = 2.0,
                 lru_tokens: int | None = None, **kw: Any):
        super().__init__(num_instances, seed, profile, **kw)
        self.w = (float(prefix_weight), float(queue_weight), float(kv_weight))
        self.trees = PrefixTrees(num_instances, lru_bound(lru_tokens, profile))

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        healthy = [iv for iv in view.instances if iv.healthy]
        if not healthy:
            return None
        r = queue[0]
        waiting = [iv.num_prefilling for iv in healthy]
        lo, hi = min(waiting), max(waiting)
        wp, wq, wk = self.w
        scores = {}
        for iv, q, prefix in zip(healthy, waiting, self.prefix_scores(r, healthy, now_s)):
            queue_score = 1.0 if hi == lo else (hi - q) / (hi - lo)
            used = (iv.context_tokens + iv.prompt_tokens_pending) / max(1, iv.spec.kv_capacity_tokens)
            scores[iv.index] = wp * prefix + wq * queue_score + wk * (1.0 - min(1.0, used))
        inst = self._argmin(view, lambda iv: -scores.get(iv.index, float("-inf")))
        assert inst is not None
        self.placed(r, inst, now_s)
        return Decision(0, inst)

    def prefix_scores(self, r: Request, healthy: Sequence[InstanceView], now_s: float) -> list[float]:
        """The prefix-cache scorer per healthy instance, in [0, 1]: the share of the prompt the router sent there
        before."""
        return [self.trees.match_tokens(iv.index, r) / max(1, r.prompt_tokens) for iv in healthy]

    def placed(self, request: Request, instance: int, now_s: float) -> None:
        """The router's prefix view remembers the placement."""
        super().placed(request, instance, now_s)
        self.trees.insert(instance, request)


@register("session_affinity", "every turn of a session to the instance of its first turn (least loaded then)")
class SessionAffinity(_Base):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None, **kw: Any):
        super().__init__(num_instances, seed, profile, **kw)
        self.home: dict[int, int] = {}

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        r = queue[0]
        home = self.home.get(r.session_id) if r.session_id is not None else None
        if home is None or not view.instances[home].healthy:
            home = self._argmin(view, lambda iv: iv.num_outstanding)
            if home is None:
                return None
            if r.session_id is not None:
                self.home[r.session_id] = home
        return Decision(0, home)
