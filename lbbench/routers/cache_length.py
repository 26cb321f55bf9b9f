"""``cache_length_aware``: lbbench's router that weighs expected cache hits against load,
with predicted output lengths and KV headroom.

For each instance it estimates, in seconds, how much latency the request adds
to everyone there, from the profile's step-time model and what a client sees:

- the request's own time: the uncached prompt tokens queued ahead of it there
  plus its own (prompt minus the expected cache hit), plus, when every
  sequence slot (``max_num_seqs``) is taken, the wait for enough requests to
  finish; then its predicted output length at that instance's decode step time;
- what it costs the others: its prefill holds up the decoding requests there
  (a vLLM V0 prefill step pauses them; in V1 it lengthens their step), and its
  decode adds to their step time for as long as both run.

The cost is time to first token plus ``decode_weight`` times the decode terms
(own decode time and the others' delay). Defaults were chosen on tuning data
only (``bench/eval_prefix_routers.py --split tune``: the first quarter of the
Mooncake trace, session seeds 100-101): ``decode_weight`` 0.1 of 0, 0.1, 0.3,
1 (lowest mean TTFT); ``headroom_rule`` current (better TTFT and goodput at
12 req/s, no change elsewhere). ``hit_weight`` > 1 (valuing a hit beyond its
own prefill saving) and ``session_spread`` (place a session's first turn by
load alone) changed nothing consistently and stay off; without the free-slot
preference (``slot_filter = false``) TTFT at 12 req/s was worse.

The expected hit comes from the router's own prefix trees (what it sent where,
LRU-bounded by the instance's KV capacity); the uncached prompt work queued at
an instance is tracked from dispatches and first tokens. Instances whose KV
need would exceed ``1 - kv_slack`` of their capacity are avoided, since a full
cache means preemptions. The need is, with ``headroom_rule = "current"``, the
KV of the decoding requests there now, the uncached prompts queued there and
the new request's uncached prompt and predicted output; with ``"footprint"``,
prompt + predicted output of everything outstanding (which counts a shared
prefix once per request, too pessimistic under sharing). Also avoided are
instances whose sequence slots are all taken (the request would wait there for
a finish); a free slot weighs more than KV headroom. If every instance is short
of both, the one with the most headroom is taken.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core import ClusterView, Decision, Event, InstanceView, Request
from ..profiles import Profile, load_profile
from .heuristics import _Base
from .kv_overlap import PendingPrefill
from .prefix_tree import PrefixTrees
from .registry import register


@register("cache_length_aware", "lbbench: least added latency from expected cache hit, queued uncached prefill, "
                                "predicted output length; avoids instances short of KV headroom")
class CacheLengthAware(_Base):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 kv_slack: float = 0.1, decode_weight: float = 0.1, hit_weight: float = 1.0,
                 headroom_rule: str = "current", session_spread: bool = False, slot_filter: bool = True,
                 lru_tokens: int | None = None, **kw: Any):
        super().__init__(num_instances, seed, profile, **kw)
        self.prof = profile if profile is not None else load_profile("llama3.1-8b-a100")
        if not 0 <= kv_slack < 1:
            raise ValueError(f"cache_length_aware: kv_slack must be in [0, 1), got {kv_slack}")
        self.kv_slack = float(kv_slack)
        self.decode_weight = float(decode_weight)
        self.hit_weight = float(hit_weight)
        if headroom_rule not in ("footprint", "current"):
            raise ValueError(f"cache_length_aware: headroom_rule must be footprint or current, not {headroom_rule!r}")
        self.headroom_rule = headroom_rule
        self.session_spread = bool(session_spread)
        self.slot_filter = bool(slot_filter)
        self.trees = PrefixTrees(num_instances, int(lru_tokens or self.prof.kv_capacity_tokens))
        self.prefill = PendingPrefill(num_instances)  # uncached prompt tokens dispatched, no first token yet

    # ------------------------------------------------------------------ events
    def on_event(self, ev: Event) -> None:
        self.prefill.on_event(ev)

    # ------------------------------------------------------------------ routing
    def ttft_estimate(self, iv: InstanceView, uncached_tokens: int, pending_tokens: int, slot_wait_s: float) -> float:
        """Time to first token there: the uncached prompt work queued ahead plus the request's own, at the
        profile's prefill speed, plus one base step and the wait for a free sequence slot."""
        return self.prof.prefill_token_s * (pending_tokens + uncached_tokens) + self.prof.base_s + slot_wait_s

    def dispatched(self, request: Request, instance: int, now_s: float) -> None:
        """Hook: the request goes to ``instance`` now (a learned subclass remembers what it predicted)."""

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        r = queue[0]
        p = self.prof
        a, b, c, base = p.prefill_token_s, p.decode_seq_s, p.context_token_s, p.base_s
        out = max(1, r.expected_output_tokens)
        # a session's first turn places the whole conversation: place it by load, not by a shared system prompt
        first_turn = self.session_spread and r.session_id is not None and not r.turn
        pending = self.prefill.tokens
        costs: dict[int, float] = {}
        headroom: dict[int, float] = {}
        for iv in view.instances:
            if not iv.healthy:
                continue
            hit = min(self.trees.match_tokens(iv.index, r), r.prompt_tokens - 1)
            if first_turn:
                hit = 0
            uncached = r.prompt_tokens - hit
            n_dec = iv.num_decoding
            ctx = iv.context_tokens + r.prompt_tokens + out / 2
            step = base + b * (n_dec + 1) + c * ctx
            mean_left = iv.predicted_tokens_remaining / max(1, iv.num_outstanding)
            slot_wait_s = 0.0
            excess = iv.num_outstanding + 1 - iv.spec.max_num_seqs
            if excess > 0:  # no free sequence slot: it waits for finishes (n_dec finish per mean_left steps)
                slot_wait_s = excess * mean_left * step / max(1, n_dec)
            ttft = self.ttft_estimate(iv, uncached, pending[iv.index], slot_wait_s)
            others = n_dec * (a * uncached + min(out, mean_left) * (b + c * (r.prompt_tokens + out / 2)))
            # a hit also keeps the prefix on one instance for the requests that follow
            costs[iv.index] = ttft + self.decode_weight * (out * step + others) - (self.hit_weight - 1) * a * hit
            cap = iv.spec.kv_capacity_tokens
            if self.headroom_rule == "footprint":
                need = iv.predicted_footprint_tokens + uncached + out
            else:  # KV of the decoding requests now + uncached prompts queued + this request's growth
                need = iv.context_tokens + pending[iv.index] + uncached + out
            headroom[iv.index] = (1 - self.kv_slack) * cap - need
        if not costs:
            return None
        fits = {i for i, h in headroom.items() if h >= 0}
        free = {iv.index for iv in view.instances if iv.index in costs and iv.num_outstanding < iv.spec.max_num_seqs}
        pool = ((fits & free) or free or fits) if self.slot_filter else fits
        if pool:
            inst = self._argmin(view, lambda iv: costs[iv.index] if iv.index in pool else float("inf"))
        else:
            inst = self._argmin(view, lambda iv: -headroom.get(iv.index, float("-inf")))
        assert inst is not None
        self.placed(r, inst, now_s)
        return Decision(0, inst)

    def placed(self, request: Request, instance: int, now_s: float) -> None:
        """The queued uncached prefill and the prefix trees learn of the placement."""
        super().placed(request, instance, now_s)
        hit = min(self.trees.match_tokens(instance, request), request.prompt_tokens - 1)
        self.dispatched(request, instance, now_s)
        self.prefill.dispatched(request, instance, request.prompt_tokens - hit)
        self.trees.insert(instance, request)
