"""``kv_overlap``: NVIDIA Dynamo's KV router cost, as a baseline.

Source: ``ai-dynamo/dynamo``, ``lib/llm/src/kv_router/scheduler.rs`` (``DefaultWorkerSelector::select_worker``
and ``softmax_sample``) at commit ``db19bd2a659d4cb04998fb4101cd0dbfbbeba9d4``; the options are documented in
``docs/router/kv_cache_routing.md`` (``--kv-overlap-score-weight``, default 1; ``--router-temperature``,
default 0). Later Dynamo versions (``lib/kv-router/src/scheduling/selector/default.rs``) refine the same cost
with overlap credits and tiers; this router follows the published two-term form.

For each instance, the cost of sending the request there is, in KV blocks,

    overlap_weight * prefill_blocks + decode_blocks

- ``prefill_blocks``: the prompt tokens that instance would still have to prefill if the request went there,
  over the block size: the uncached prompt tokens of the requests it was sent and that have not produced a
  first token yet, plus this request's prompt minus its expected cache hit there;
- ``decode_blocks``: the KV blocks the instance would hold: the context of everything outstanding there
  (decoding context and pending prompts, from the view) plus this request's uncached prompt.

At ``temperature`` 0 the lowest cost wins; ties go to the instance whose prefix tree is smallest, then at
random (seeded). Above 0, an instance is drawn with probability proportional to
``exp(-cost / (range * temperature))``, ``range`` the spread of the costs (uniform when they are all equal).

The expected hit comes from the router's prefix view (``PrefixTrees``, what it sent where, LRU-bounded by the
instance's KV capacity), the one ``cache_aware`` and ``cache_length_aware`` use; Dynamo reads it from the
engines' KV events, or approximates it from its own decisions as here (``--no-kv-events``). Dynamo counts a
block shared by two active sequences once; the view counts each request's context, so a shared prefix counts
once per request. The block size scales every term alike and does not change a decision (``block_tokens``,
vLLM's default 16, only sets the units).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..core import ClusterView, Decision, Event, Failed, Finished, FirstToken, Preempted, Request
from ..errors import InputError
from ..profiles import Profile
from .heuristics import _Seeded
from .prefix_tree import PrefixTrees, lru_bound
from .registry import register

DYNAMO_SOURCE = "ai-dynamo/dynamo lib/llm/src/kv_router/scheduler.rs @ db19bd2a659d4cb04998fb4101cd0dbfbbeba9d4"


class PendingPrefill:
    """Per instance, the uncached prompt tokens of the requests sent there that have not produced a first
    token yet (a preempted request's whole prompt counts again until it does)."""

    def __init__(self, num_instances: int):
        self.tokens = [0] * num_instances
        self._sent: dict[int, tuple[int, int, int]] = {}  # request id -> (instance, counted tokens, prompt)
        self._waiting: set[int] = set()

    def dispatched(self, request: Request, instance: int, uncached_tokens: int) -> None:
        self._sent[request.request_id] = (instance, uncached_tokens, request.prompt_tokens)
        self._waiting.add(request.request_id)
        self.tokens[instance] += uncached_tokens

    def on_event(self, ev: Event) -> None:
        rid = getattr(ev, "request_id", None)
        if rid is None or rid not in self._sent:
            return
        inst, counted, prompt = self._sent[rid]
        if isinstance(ev, FirstToken) and rid in self._waiting:
            self._waiting.discard(rid)
            self.tokens[inst] -= counted
        elif isinstance(ev, Preempted) and rid not in self._waiting:
            self._waiting.add(rid)
            self._sent[rid] = (inst, prompt, prompt)
            self.tokens[inst] += prompt
        elif isinstance(ev, (Finished, Failed)):
            if rid in self._waiting:
                self._waiting.discard(rid)
                self.tokens[inst] -= counted
            del self._sent[rid]


def softmax_pick(costs: Sequence[float], temperature: float, u: float) -> int:
    """Dynamo's softmax sampling over costs (lower is likelier): the row whose cumulative probability first
    reaches ``u`` in ``[0, 1)``. Costs are scaled by their range, so only their spread relative to
    ``temperature`` matters."""
    lo, hi = min(costs), max(costs)
    if hi == lo:
        probs = [1.0 / len(costs)] * len(costs)
    else:
        scaled = [-(c / (hi - lo)) / temperature for c in costs]
        top = max(scaled)
        probs = [math.exp(s - top) for s in scaled]
        total = sum(probs)
        probs = [p / total for p in probs]
    acc = 0.0
    for row, p in enumerate(probs):
        acc += p
        if u <= acc:
            return row
    return len(costs) - 1


@register("kv_overlap", "NVIDIA Dynamo's KV router: lowest overlap_weight x prefill blocks to compute + decode "
                        "blocks, softmax at a temperature (" + DYNAMO_SOURCE + ")")
class KvOverlap(_Seeded):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 overlap_weight: float = 1.0, temperature: float = 0.0, block_tokens: int = 16,
                 lru_tokens: int | None = None, **kw: Any):
        super().__init__(num_instances, seed, profile=profile, **kw)
        if not (math.isfinite(overlap_weight) and overlap_weight >= 0):
            raise InputError(f"kv_overlap: overlap_weight must be >= 0, got {overlap_weight}")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise InputError(f"kv_overlap: temperature must be >= 0, got {temperature}")
        if int(block_tokens) < 1:
            raise InputError(f"kv_overlap: block_tokens must be >= 1, got {block_tokens}")
        self.overlap_weight = float(overlap_weight)
        self.temperature = float(temperature)
        self.block_tokens = int(block_tokens)
        self.trees = PrefixTrees(num_instances, lru_bound(lru_tokens, profile))
        self.prefill = PendingPrefill(num_instances)

    def on_event(self, ev: Event) -> None:
        self.prefill.on_event(ev)

    def costs(self, request: Request, view: ClusterView) -> dict[int, tuple[float, int]]:
        """Per healthy instance: (cost in blocks, uncached prompt tokens of ``request`` there)."""
        b = float(self.block_tokens)
        w = self.overlap_weight
        out: dict[int, tuple[float, int]] = {}
        for iv in view.instances:
            if not iv.healthy:
                continue
            i = iv.index
            uncached = request.prompt_tokens - self.trees.match_tokens(i, request)
            prefill_blocks = (self.prefill.tokens[i] + uncached) / b
            decode_blocks = (iv.context_tokens + iv.prompt_tokens_pending + uncached) / b
            out[i] = (w * prefill_blocks + decode_blocks, uncached)
        return out

    def scores(self, request: Request, view: ClusterView) -> list[float]:
        """Per instance, the cost in blocks ``route`` minimises (inf: unhealthy)."""
        costs = self.costs(request, view)
        return [costs[i][0] if i in costs else math.inf for i in range(len(view.instances))]

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        r = queue[0]
        costs = self.costs(r, view)
        if not costs:
            return None
        idx = list(costs)
        values = [costs[i][0] for i in idx]
        if self.temperature == 0.0:
            low = min(values)
            tied = [i for i, v in zip(idx, values) if v == low]
            if len(tied) > 1:  # Dynamo: the smallest prefix tree, then at random
                small = min(self.trees.tokens[i] for i in tied)
                tied = [i for i in tied if self.trees.tokens[i] == small]
            inst = tied[0] if len(tied) == 1 else tied[int(self._rng.integers(len(tied)))]
        else:
            inst = idx[softmax_pick(values, self.temperature, float(self._rng.random()))]
        self.trees.insert(inst, r)
        self.prefill.dispatched(r, inst, costs[inst][1])
        self._last = inst
        return Decision(0, inst)
