"""``token_affinity``: llm-d's optimized baseline, "sticky until saturated", as a baseline.

Source: ``llm-d/llm-d-router`` (formerly ``llm-d-inference-scheduler``) at commit
``ebab687927f5331c1b39defcb579a07951bce56c``: the ``prefix-cache-affinity-filter``
(``pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/``) in front of the ``token-load-scorer``
(``pkg/epp/framework/plugins/scheduling/scorer/tokenload/``) fed by the ``inflight-load-producer``
(``pkg/epp/framework/plugins/requestcontrol/dataproducer/inflightload/``), the profile of llm-d's
``guides/optimized-baseline`` (llm-d blog, "sticky until saturated: token-aware routing", 2026).

1. Sticky instances: those whose prefix score for the request reaches ``affinity_threshold`` (0.80). The score
   is llm-d's approximate prefix score (the ``approx-prefix-cache-producer``,
   ``pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/plugin.go`` and ``prefixhash/hashing.go``
   at the same commit): the prompt is cut into blocks of ``block_tokens`` tokens, 64 (llm-d raises the engine's
   block size, vLLM's 16, to its ``minBlockSizeTokens`` of 64), its incomplete tail block included; the score is the
   share of those blocks, from the first, that the router sent to the instance before (its prefix view,
   ``PrefixTrees``, keyed per 64-token block; each instance's index holds one entry per engine KV block of the
   instance, as llm-d's autotuned LRU does, ``lru_blocks``). A prompt shorter than 64 tokens is one block, so a
   repeated short prompt scores 1. A request without prefix hashes but in a session scores 1 at the instance its
   previous turn went to (llm-d hashes the text; lbbench has only the hashes). With no sticky instance every
   instance stays in play.
2. The load gate: each instance's TTFT is estimated as its in-flight tokens over its prefill throughput. If the
   best sticky instance's estimate exceeds the best non-sticky one's by more than ``max_ttft_penalty_s`` (18 s),
   stickiness breaks and every instance stays in play; 0 always sticks. In tokens: affinity holds until an
   instance's backlog passes ``throughput x window`` beyond the least loaded one's.
3. Among those in play, the token-load score ``1 - min(1, in-flight tokens / queue_threshold_tokens)``
   (threshold 4,194,304) picks the highest: the least loaded. Ties rotate.

With probability ``exploration_probability`` (0, llm-d's default) the gate is skipped. In-flight tokens are
the uncached prompt tokens of requests sent there that have not produced a first token (llm-d's default,
``addEstimatedOutputTokens = false``), counted as llm-d's ``inflight-load-producer`` counts them: the unmatched
blocks times the block size. The throughput is the instance's own prefill throughput
(``InstanceSpec.prefill_tokens_per_s``, from its profile or measured live) unless ``peak_prefill_tokens_per_s``
sets one figure for all, as llm-d's ``peakPrefillThroughput`` (15,928 tokens/s, calibrated for Qwen3-32B TP2 on
H100) does.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..core import ClusterView, Decision, Event, Request
from ..errors import InputError
from ..prefix_blocks import num_blocks
from ..profiles import Profile
from .heuristics import _Seeded
from .kv_overlap import PendingPrefill
from .prefix_tree import PrefixTrees
from .registry import register

#: llm-d's prefix-index block: the engine's block size raised to ``minBlockSizeTokens`` (64)
LLMD_BLOCK_TOKENS = 64
#: llm-d's index capacity per server without endpoint metrics (``defaultLRUCapacityPerServer``), in entries
LLMD_DEFAULT_LRU_BLOCKS = 31250


def llmd_prefix_trees(num_instances: int, profile: Profile | None, block_tokens: int = LLMD_BLOCK_TOKENS,
                      lru_blocks: int | None = None) -> PrefixTrees:
    """llm-d's approximate prefix index: ``block_tokens``-token blocks (the tail included), one LRU entry per
    engine KV block of the instance (``lru_blocks``, else the profile's KV blocks, else llm-d's default)."""
    entries = lru_blocks or (profile.num_kv_blocks if profile is not None else LLMD_DEFAULT_LRU_BLOCKS)
    return PrefixTrees(num_instances, int(entries) * block_tokens, block_tokens=block_tokens)


def llmd_prefix_score(trees: PrefixTrees, instance: int, request: Request) -> tuple[float, int]:
    """llm-d's prefix score of ``request`` on ``instance`` (matched blocks / the prompt's blocks) and the uncached
    prompt tokens its in-flight load counts ((blocks - matched) x block size)."""
    b = trees.block_tokens or LLMD_BLOCK_TOKENS
    total = num_blocks(request.prompt_tokens, b, partial=True)
    matched = trees.match_blocks(instance, request) if request.prefix_hashes else 0
    return (matched / total if total else 0.0), (total - matched) * b

LLMD_SOURCE = ("llm-d/llm-d-router pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity + "
               "scorer/tokenload @ ebab687927f5331c1b39defcb579a07951bce56c")


@register("token_affinity", "llm-d's optimized baseline, sticky until saturated: prefix affinity (>= 80 % of the "
                            "prompt's 64-token blocks) until the sticky instance's prefill backlog trails the best other's by 18 s, "
                            "then the fewest in-flight tokens (" + LLMD_SOURCE + ")")
class TokenAffinity(_Seeded):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 affinity_threshold: float = 0.80, max_ttft_penalty_s: float = 18.0,
                 peak_prefill_tokens_per_s: float | None = None, queue_threshold_tokens: int = 4_194_304,
                 exploration_probability: float = 0.0, block_tokens: int = LLMD_BLOCK_TOKENS,
                 lru_blocks: int | None = None, **kw: Any):
        super().__init__(num_instances, seed, profile=profile, **kw)
        if not 0 <= affinity_threshold <= 1:
            raise InputError(f"token_affinity: affinity_threshold must be in [0, 1], got {affinity_threshold}")
        if not (math.isfinite(max_ttft_penalty_s) and max_ttft_penalty_s >= 0):
            raise InputError(f"token_affinity: max_ttft_penalty_s must be >= 0, got {max_ttft_penalty_s}")
        if peak_prefill_tokens_per_s is not None and not (math.isfinite(peak_prefill_tokens_per_s)
                                                          and peak_prefill_tokens_per_s > 0):
            raise InputError(f"token_affinity: peak_prefill_tokens_per_s must be > 0, got {peak_prefill_tokens_per_s}")
        if int(queue_threshold_tokens) < 1:
            raise InputError(f"token_affinity: queue_threshold_tokens must be >= 1, got {queue_threshold_tokens}")
        if not 0 <= exploration_probability <= 1:
            raise InputError(f"token_affinity: exploration_probability must be in [0, 1], "
                             f"got {exploration_probability}")
        if int(block_tokens) < 1:
            raise InputError(f"token_affinity: block_tokens must be >= 1, got {block_tokens}")
        if lru_blocks is not None and int(lru_blocks) < 1:
            raise InputError(f"token_affinity: lru_blocks must be >= 1, got {lru_blocks}")
        self.affinity_threshold = float(affinity_threshold)
        self.max_ttft_penalty_s = float(max_ttft_penalty_s)
        self.peak_prefill_tokens_per_s = None if peak_prefill_tokens_per_s is None else float(peak_prefill_tokens_per_s)
        self.queue_threshold_tokens = int(queue_threshold_tokens)
        self.exploration_probability = float(exploration_probability)
        self.trees = llmd_prefix_trees(num_instances, profile, int(block_tokens), lru_blocks)
        self.inflight = PendingPrefill(num_instances)
        self.home: dict[int, int] = {}  # session -> instance of its last turn

    def on_event(self, ev: Event) -> None:
        self.inflight.on_event(ev)

    def prefix_score(self, instance: int, request: Request) -> float:
        """llm-d's prefix score of ``request`` on ``instance``: the share of its 64-token blocks expected cached
        there (session home without hashes: 1)."""
        if request.prefix_hashes:
            return llmd_prefix_score(self.trees, instance, request)[0]
        if request.session_id is not None:
            return 1.0 if self.home.get(request.session_id) == instance else 0.0
        return 0.0

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        r = queue[0]
        healthy = [iv for iv in view.instances if iv.healthy]
        if not healthy:
            return None
        tokens = self.inflight.tokens
        in_play = {iv.index for iv in healthy}
        explore = self.exploration_probability > 0 and self._rng.random() < self.exploration_probability
        if self.affinity_threshold > 0 and not explore:
            sticky = {iv.index for iv in healthy if self.prefix_score(iv.index, r) >= self.affinity_threshold}
            if sticky:
                def ttft_s(iv: Any) -> float:
                    rate = self.peak_prefill_tokens_per_s or iv.spec.prefill_tokens_per_s
                    return tokens[iv.index] / rate
                best_sticky = min(ttft_s(iv) for iv in healthy if iv.index in sticky)
                others = [ttft_s(iv) for iv in healthy if iv.index not in sticky]
                if (not others or self.max_ttft_penalty_s == 0
                        or best_sticky - min(others) <= self.max_ttft_penalty_s):
                    in_play = sticky
        q = float(self.queue_threshold_tokens)
        inst = self._argmin(view, lambda iv: -(1.0 - min(1.0, tokens[iv.index] / q))
                            if iv.index in in_play else math.inf)
        assert inst is not None
        self.placed(r, inst, now_s)
        return Decision(0, inst)

    def placed(self, request: Request, instance: int, now_s: float) -> None:
        """The prefix index, the in-flight tokens and the session's home learn of the placement."""
        super().placed(request, instance, now_s)
        uncached = llmd_prefix_score(self.trees, instance, request)[1]
        self.trees.insert(instance, request)
        self.inflight.dispatched(request, instance, uncached)
        if request.session_id is not None:
            self.home[request.session_id] = instance
