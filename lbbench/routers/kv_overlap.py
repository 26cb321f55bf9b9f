"""``kv_overlap``: NVIDIA Dynamo's KV router cost, as a baseline.

Source: ``ai-dynamo/dynamo`` at commit ``db19bd2a659d4cb04998fb4101cd0dbfbbeba9d4``: the cost and the pick in
``lib/llm/src/kv_router/scheduler.rs`` (``DefaultWorkerSelector::select_worker``, ``softmax_sample``); the load it
reads comes from the ``ActiveSequences`` of ``lib/llm/src/kv_router/sequence.rs`` that file imports
(``add_request``, ``mark_prefill_completed``, ``free``, ``new_blocks``, ``potential_blocks_and_tokens``; read at a
stored version of the same era). The options are documented in ``docs/router/kv_cache_routing.md``
(``--kv-overlap-score-weight``, default 1; ``--router-temperature``, default 0); ``KvRouterConfig``'s defaults track
active blocks, assume KV reuse between them, and do not track output blocks. Later Dynamo versions
(``lib/kv-router/src/scheduling/selector/default.rs``) refine the same cost with overlap credits and tiers; this
router follows the two-term form.

For each instance ``w``, in KV blocks of ``block_tokens`` (the engine's block size: the profile's, else vLLM's 16):

    overlap_weight * prefill_tokens(w) / block_tokens + decode_blocks(w)

- ``overlap(w)``: the request's prompt blocks expected cached on ``w`` (whole blocks).
- ``prefill_tokens(w)``: the tokens ``w`` would still have to prefill if the request went there: the new tokens of
  every request routed there that has not produced a first token yet (each counted when it was routed:
  ``prompt - overlap x block``), plus this request's ``prompt - overlap(w) x block``.
- ``decode_blocks(w)``: the KV blocks ``w``'s active requests hold, each block counted once however many active
  requests share it (a request is active from its routing to its end), plus this request's prompt blocks that no
  active request there holds. A cached prefix that no active request holds is credited once, in the prefill term;
  it does not lower the decode term. Only prompt blocks count (output blocks are not tracked, Dynamo's default).

At ``temperature`` 0 the lowest cost wins; ties go to the instance whose prefix tree is smallest, then at
random (seeded). Above 0, an instance is drawn with probability proportional to
``exp(-cost / (range * temperature))``, ``range`` the spread of the costs (uniform when they are all equal).

A request's blocks are its full ``block_tokens`` blocks, keyed by everything up to their end
(``lbbench.prefix_blocks``: equal keys, equal content), as Dynamo hashes a prompt's complete blocks; blocks its
prefix hashes do not cover are its own. The expected cache hit comes from the router's prefix view (``PrefixTrees``,
what it sent where, LRU-bounded by the instance's KV capacity), the one ``cache_aware`` and ``cache_length_aware``
use; Dynamo reads it from the engines' KV events, or approximates it from its own decisions as here
(``--no-kv-events``, with a TTL where lbbench bounds by capacity). Like Dynamo, the router learns of a request's
progress from its own responses only (first token, end), never of engine preemptions.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..core import ClusterView, Decision, Event, Failed, Finished, FirstToken, Preempted, Request
from ..errors import InputError
from ..prefix_blocks import block_keys
from ..profiles import Profile
from .heuristics import _Seeded
from .prefix_tree import PrefixTrees, lru_bound
from .registry import register

DYNAMO_SOURCE = ("ai-dynamo/dynamo lib/llm/src/kv_router/scheduler.rs + sequence.rs @ "
                 "db19bd2a659d4cb04998fb4101cd0dbfbbeba9d4")


class PendingPrefill:
    """Per instance, the uncached prompt tokens of the requests sent there that have not produced a first
    token yet (with ``count_preemptions``, a preempted request's whole prompt counts again until it does)."""

    def __init__(self, num_instances: int, count_preemptions: bool = True):
        self.tokens = [0] * num_instances
        self.count_preemptions = count_preemptions
        self._sent: dict[int, tuple[int, int, int]] = {}  # request id -> (instance, counted tokens, prompt)
        self._waiting: set[int] = set()

    def __deepcopy__(self, memo: dict) -> "PendingPrefill":
        """A separate copy, one C copy per container (its values are ints and tuples of ints): a planner copies it
        into every rollout."""
        new = PendingPrefill.__new__(PendingPrefill)
        new.tokens, new.count_preemptions = list(self.tokens), self.count_preemptions
        new._sent, new._waiting = dict(self._sent), set(self._waiting)
        return new

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
        elif isinstance(ev, Preempted) and rid not in self._waiting and self.count_preemptions:
            self._waiting.add(rid)
            self._sent[rid] = (inst, prompt, prompt)
            self.tokens[inst] += prompt
        elif isinstance(ev, (Finished, Failed)):
            if rid in self._waiting:
                self._waiting.discard(rid)
                self.tokens[inst] -= counted
            del self._sent[rid]


class ActiveBlocks:
    """Per instance, the prompt blocks of its active requests (routed there, not finished), each block once however
    many requests share it (Dynamo's ``ActiveSequences``)."""

    def __init__(self, num_instances: int, block_tokens: int):
        self.block_tokens = block_tokens
        self.ref: list[dict[int, int]] = [{} for _ in range(num_instances)]  # key -> active requests holding it
        self.own = [0] * num_instances  # blocks no other request can share (past the request's prefix hashes)
        self._held: dict[int, tuple[int, list[int], int]] = {}  # request id -> (instance, keys, own blocks)
        self._memo: tuple[int, list[int], int] | None = None

    def blocks(self, request: Request) -> tuple[list[int], int]:
        """The request's prompt blocks: keys of the full blocks its hashes name, and how many more are its own."""
        m = self._memo
        if m is None or m[0] != request.request_id:
            keys = block_keys(request, self.block_tokens)
            m = self._memo = (request.request_id, keys, request.prompt_tokens // self.block_tokens - len(keys))
        return m[1], m[2]

    def num_active(self, instance: int) -> int:
        return len(self.ref[instance]) + self.own[instance]

    def num_new(self, instance: int, request: Request) -> int:
        """The request's blocks that no active request on ``instance`` holds. Keys held there form a prefix of the
        request's keys (a key implies every earlier one of its request), so a binary search finds where they end."""
        keys, own = self.blocks(request)
        ref = self.ref[instance]
        lo, hi = 0, len(keys)  # keys[:lo] held, keys[hi:] not
        while lo < hi:
            mid = (lo + hi) // 2
            if keys[mid] in ref:
                lo = mid + 1
            else:
                hi = mid
        return len(keys) - lo + own

    def add(self, request: Request, instance: int) -> None:
        keys, own = self.blocks(request)
        ref = self.ref[instance]
        for k in keys:
            ref[k] = ref.get(k, 0) + 1
        self.own[instance] += own
        self._held[request.request_id] = (instance, keys, own)

    def free(self, request_id: int) -> None:
        held = self._held.pop(request_id, None)
        if held is None:
            return
        instance, keys, own = held
        ref = self.ref[instance]
        for k in keys:
            n = ref[k] - 1
            if n:
                ref[k] = n
            else:
                del ref[k]
        self.own[instance] -= own


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
                        "blocks (active blocks, shared ones once, plus the request's new ones), softmax at a "
                        "temperature (" + DYNAMO_SOURCE + ")")
class KvOverlap(_Seeded):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 overlap_weight: float = 1.0, temperature: float = 0.0, block_tokens: int | None = None,
                 lru_tokens: int | None = None, **kw: Any):
        super().__init__(num_instances, seed, profile=profile, **kw)
        if not (math.isfinite(overlap_weight) and overlap_weight >= 0):
            raise InputError(f"kv_overlap: overlap_weight must be >= 0, got {overlap_weight}")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise InputError(f"kv_overlap: temperature must be >= 0, got {temperature}")
        if block_tokens is None:  # Dynamo's router blocks are the engine's KV blocks
            block_tokens = profile.block_size if profile is not None else 16
        if int(block_tokens) < 1:
            raise InputError(f"kv_overlap: block_tokens must be >= 1, got {block_tokens}")
        self.overlap_weight = float(overlap_weight)
        self.temperature = float(temperature)
        self.block_tokens = int(block_tokens)
        self.trees = PrefixTrees(num_instances, lru_bound(lru_tokens, profile))
        self.prefill = PendingPrefill(num_instances, count_preemptions=False)
        self.active = ActiveBlocks(num_instances, self.block_tokens)

    def on_event(self, ev: Event) -> None:
        self.prefill.on_event(ev)
        if isinstance(ev, (Finished, Failed)):
            self.active.free(ev.request_id)

    def costs(self, request: Request, view: ClusterView) -> dict[int, tuple[float, int]]:
        """Per healthy instance: (cost in blocks, new prompt tokens of ``request`` there)."""
        b = self.block_tokens
        w = self.overlap_weight
        out: dict[int, tuple[float, int]] = {}
        for iv in view.instances:
            if not iv.healthy:
                continue
            i = iv.index
            overlap = self.trees.match_tokens(i, request) // b
            new_tokens = max(0, request.prompt_tokens - overlap * b)
            prefill_blocks = (self.prefill.tokens[i] + new_tokens) / b
            decode_blocks = self.active.num_active(i) + self.active.num_new(i, request)
            out[i] = (w * prefill_blocks + decode_blocks, new_tokens)
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
        self.placed(r, inst, now_s)
        return Decision(0, inst)

    def placed(self, request: Request, instance: int, now_s: float) -> None:
        """The prefix view, the pending prefill and the active blocks learn of the placement."""
        new_tokens = max(0, request.prompt_tokens - self.trees.match_tokens(instance, request)
                         // self.block_tokens * self.block_tokens)
        self.trees.insert(instance, request)
        self.prefill.dispatched(request, instance, new_tokens)
        self.active.add(request, instance)
        self._last = instance
