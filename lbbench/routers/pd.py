"""Routers for prefill/decode pairs: each picks where a request decodes and, when it disaggregates, where it
prefills (``PairDecision``). They run on a fleet with roles (``--fleet NAME:COUNT:prefill,NAME:COUNT:decode``;
``lbbench.sim.disagg``). Prefill candidates are the ``prefill`` instances; decode candidates the ``decode`` and
``mixed`` ones, which also serve a request whole (as a decode pod of llm-d runs both stages when the decider
says so). The expected prefix hit of an instance is the router's prefix view (``PrefixTrees``: what it sent
where), into which a disaggregated request goes on both sides (the decode instance caches the KV it imports).

- ``pd_llmd`` / ``pd_llmd_always``: llm-d's ``disagg-profile-handler``. Source: ``llm-d/llm-d-inference-scheduler``
  ``docs/disagg_pd.md`` at ``514e437315aa8bc3e0749c6018a9c1c4b0caf48c`` and
  ``pkg/plugins/profile/prefix_based_pd_decider.go`` at ``278a3e44d51d36894c01d310cdca8fce234c5be0``
  (Apache-2.0). The decode pod first, by the decode profile's scorers (here the prefix score, the share of the
  prompt expected cached, plus a queue score ``1 - (q - q_min) / (q_max - q_min)`` over the candidates'
  outstanding requests, 1 when all are equal; the highest wins, ties to the lowest index). Then the
  ``prefix-based-pd-decider``: with ``non_cached_tokens`` <= 0 it always disaggregates; otherwise a prompt
  shorter than the threshold, or whose uncached suffix on the chosen decode pod (prompt minus the cached
  prefix) is shorter, runs whole on the decode pod; else a prefill pod is picked by the same scorers among the
  prefill instances. ``pd_llmd_always`` is the ``always-disagg-pd-decider``.
- ``pd_dynamo``: Dynamo's ``PrefillRouter``. Source: ``ai-dynamo/dynamo`` ``docs/design_docs/disagg_serving.md``
  at ``66e265b812bf87745f85355790c1a86754dff691`` (Apache-2.0): the prefill worker first, KV-aware (the cost of
  ``kv_overlap``: overlap-weighted prefill blocks plus active blocks), then the decode worker by the same cost
  with prefix scoring off (overlap weight 0: active blocks only). Dynamo picks the decode worker once the
  prefill is done; here both are picked at dispatch.
- ``pd_vllm``: vLLM's router (``vllm-project/router`` ``src/routers/http/vllm_pd_router.rs`` at
  ``079da2e3e685913d0057f6d3649070f826cbd445``, Apache-2.0): a worker of the prefill group by the prefill
  policy, then one of the decode group by the decode policy; both round robin here (the router's policies are
  configured; round robin is the plainest). Always disaggregates.
- ``pd_joint``: lbbench's own. Prompts whose uncached part on some decode candidate is at most
  ``short_prompt_tokens`` (16, one KV block) are served whole (a transfer costs more than it saves), on the decode candidate of
  least cost below. The others take the option of least cost among every (prefill, decode) pair and every decode
  candidate serving it whole, scored jointly. A pair costs its predicted completion:
  ``prefill backlog / prefill speed + uncached prompt / prefill speed + min step`` on the prefill instance, the
  transfer ``latency + prompt x KV bytes per token / link bandwidth`` (``lbbench.kv_links``), then on the decode
  instance its own prefill backlog plus ``expected output x time per token``, a token taking
  ``min step + (outstanding + 1) / batch decode speed`` (outstanding: the requests there, those whose KV is on
  its way included). Served whole on ``d``, the request's completion is
  ``d``'s backlog, its own prefill and its decode, and it costs besides the stall its prefill imposes on the
  requests decoding on ``d`` meanwhile (``uncached prompt / prefill speed x stalled``, weighted by
  ``interference``; each decode step there carries a prefill chunk). Stalled: every request outstanding on
  ``d`` (decoding, or its KV landing or waiting for blocks), and each request the router paired with ``d`` that
  is still prefilling elsewhere, weighted by the chance its KV lands before that prefill is done (landing
  assumed even until the prefill instances have done their backlog; ``num_stalled``). So long prompts go whole
  only when the prefill side is backed up beyond what the decode side's stall costs. Speeds are the
  ``InstanceSpec``'s.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..core import ClusterView, Dispatched, Event, Failed, Finished, FirstToken, InstanceView, PairDecision, Request
from ..errors import InputError
from ..kv_links import DEFAULT_LINK, parse_kv_link
from ..kv_links import kv_bytes_per_token as profile_kv_bytes_per_token
from ..profiles import Profile
from .heuristics import _Seeded
from .kv_overlap import KvOverlap
from .prefix_tree import PrefixTrees, lru_bound
from .registry import register

LLMD_SOURCE = ("llm-d/llm-d-inference-scheduler docs/disagg_pd.md @ 514e437315aa8bc3e0749c6018a9c1c4b0caf48c, "
               "pkg/plugins/profile/prefix_based_pd_decider.go @ 278a3e44d51d36894c01d310cdca8fce234c5be0")
DYNAMO_PD_SOURCE = "ai-dynamo/dynamo docs/design_docs/disagg_serving.md @ 66e265b812bf87745f85355790c1a86754dff691"
VLLM_ROUTER_SOURCE = "vllm-project/router src/routers/http/vllm_pd_router.rs @ 079da2e3e685913d0057f6d3649070f826cbd445"


def role_groups(view: ClusterView) -> tuple[list[int], list[int]]:
    """The healthy prefill candidates (role ``prefill``) and decode candidates (``decode`` or ``mixed``)."""
    prefill = [iv.index for iv in view.instances if iv.healthy and iv.spec.role == "prefill"]
    decode = [iv.index for iv in view.instances if iv.healthy and iv.spec.role != "prefill"]
    return prefill, decode


class _PairRouter(_Seeded):
    """What the pair routers share: the prefix view, and the decision that records a pair in it."""

    pair_router = True

    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 lru_tokens: int | None = None, **kw: Any):
        super().__init__(num_instances, seed, profile=profile, **kw)
        self.trees = PrefixTrees(num_instances, lru_bound(lru_tokens, profile))

    def uncached_tokens(self, instance: int, request: Request) -> int:
        """Prompt tokens the router expects ``instance`` to compute (the prompt less its expected prefix hit)."""
        return request.prompt_tokens - min(request.prompt_tokens, self.trees.match_tokens(instance, request))

    def decide(self, request: Request, decode: int, prefill: int | None) -> PairDecision:
        self.trees.insert(decode, request)
        if prefill is not None:
            self.trees.insert(prefill, request)
        self._last = decode
        return PairDecision(0, decode, prefill)


@register("pd_llmd", "llm-d's P/D: decode pod first (prefix + queue score), then the prefix-based decider "
                     "(uncached tokens >= non_cached_tokens, 8: a prefill pod by the same scores) (" + LLMD_SOURCE + ")")
class PdLlmd(_PairRouter):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 non_cached_tokens: int = 8, prefix_weight: float = 1.0, queue_weight: float = 1.0, **kw: Any):
        super().__init__(num_instances, seed, profile=profile, **kw)
        for name, w in (("prefix_weight", prefix_weight), ("queue_weight", queue_weight)):
            if not (math.isfinite(w) and w >= 0):
                raise InputError(f"{self.name}: {name} must be >= 0, got {w}")
        self.non_cached_tokens = int(non_cached_tokens)
        self.prefix_weight, self.queue_weight = float(prefix_weight), float(queue_weight)

    def scores(self, request: Request, view: ClusterView, group: Sequence[int]) -> dict[int, float]:
        """The profile's scores of ``group``: prefix share plus queue score, weighted."""
        q = {i: view.instances[i].num_outstanding for i in group}
        lo, hi = min(q.values()), max(q.values())
        out = {}
        for i in group:
            queue = 1.0 if hi == lo else 1.0 - (q[i] - lo) / (hi - lo)
            share = (request.prompt_tokens - self.uncached_tokens(i, request)) / max(1, request.prompt_tokens)
            out[i] = self.prefix_weight * share + self.queue_weight * queue
        return out

    def _best(self, request: Request, view: ClusterView, group: Sequence[int]) -> int:
        s = self.scores(request, view, group)
        return max(group, key=lambda i: (s[i], -i))

    def disaggregate(self, request: Request, decode: int) -> bool:
        """The prefix-based decider on the chosen decode pod."""
        t = self.non_cached_tokens
        if t <= 0:
            return True
        if request.prompt_tokens < t:
            return False
        return self.uncached_tokens(decode, request) >= t

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> PairDecision | None:
        r = queue[0]
        prefill_group, decode_group = role_groups(view)
        if not decode_group:
            return None
        d = self._best(r, view, decode_group)
        p = self._best(r, view, prefill_group) if prefill_group and self.disaggregate(r, d) else None
        return self.decide(r, d, p)


@register("pd_llmd_always", "llm-d's P/D with the always-disagg-pd-decider: decode pod first, every request "
                            "prefilled on a prefill pod (" + LLMD_SOURCE + ")")
class PdLlmdAlways(PdLlmd):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None, **kw: Any):
        kw.pop("non_cached_tokens", None)
        super().__init__(num_instances, seed, profile=profile, non_cached_tokens=0, **kw)


@register("pd_dynamo", "Dynamo's PrefillRouter: the prefill worker by KV overlap and load (kv_overlap's cost), then "
                       "the decode worker by active blocks, prefix scoring off (" + DYNAMO_PD_SOURCE + ")")
class PdDynamo(_PairRouter):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 overlap_weight: float = 1.0, **kw: Any):
        super().__init__(num_instances, seed, profile=profile)
        self.prefill_cost = KvOverlap(num_instances, seed, profile, overlap_weight=overlap_weight, **kw)
        self.decode_cost = KvOverlap(num_instances, seed, profile, overlap_weight=0.0, **kw)
        self._prefill_set: frozenset[int] = frozenset()

    def on_event(self, ev: Event) -> None:
        # each side's load counts its own instances' events (a prefill leg ends on its prefill instance)
        inst = getattr(ev, "instance", None)
        (self.prefill_cost if inst in self._prefill_set else self.decode_cost).on_event(ev)

    @staticmethod
    def _pick(kv: KvOverlap, request: Request, view: ClusterView, group: Sequence[int]) -> tuple[int, int]:
        costs = kv.costs(request, view)
        best = min(group, key=lambda i: (costs[i][0], kv.trees.tokens[i], i))
        kv.trees.insert(best, request)
        kv.prefill.dispatched(request, best, costs[best][1])
        kv.active.add(request, best)
        return best, costs[best][1]

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> PairDecision | None:
        r = queue[0]
        prefill_group, decode_group = role_groups(view)
        if not decode_group:
            return None
        self._prefill_set = frozenset(prefill_group)
        p = self._pick(self.prefill_cost, r, view, prefill_group)[0] if prefill_group else None
        d = self._pick(self.decode_cost, r, view, decode_group)[0]
        return self.decide(r, d, p)


@register("pd_vllm", "vLLM router's P/D: a prefill worker of the prefill group, then a decode worker of the decode "
                     "group, each round robin (" + VLLM_ROUTER_SOURCE + ")")
class PdVllm(_PairRouter):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None, **kw: Any):
        super().__init__(num_instances, seed, profile=profile, **kw)
        self._next = {"prefill": 0, "decode": 0}

    def _round_robin(self, kind: str, group: Sequence[int]) -> int:
        k = self._next[kind] % len(group)
        self._next[kind] = k + 1
        return group[k]

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> PairDecision | None:
        r = queue[0]
        prefill_group, decode_group = role_groups(view)
        if not decode_group:
            return None
        p = self._round_robin("prefill", prefill_group) if prefill_group else None
        return self.decide(r, self._round_robin("decode", decode_group), p)


class _Committed:
    """``pd_joint``'s count, per decode instance, of the requests it paired there that are still prefilling
    elsewhere: the view shows a paired request on its decode instance only from its transfer's start."""

    def __init__(self, num_instances: int):
        self.decode_of: dict[int, int] = {}  # request id -> its decode instance, until its transfer starts
        self.num_requests = [0] * num_instances

    def sent(self, request: Request, decode: int) -> None:
        self.decode_of[request.request_id] = decode
        self.num_requests[decode] += 1

    def on_event(self, ev: Event) -> None:
        # no longer committed once its decode instance shows it (its transfer starts: ``Dispatched`` there; a
        # backend that reports no transfer start: its first token or its end there) or once it fails anywhere
        if isinstance(ev, Dispatched):
            rid = ev.request.request_id
            if self.decode_of.get(rid) != ev.instance:
                return
        elif isinstance(ev, (FirstToken, Finished)):
            rid = ev.request_id
            if self.decode_of.get(rid) != ev.instance:
                return
        elif isinstance(ev, Failed):
            rid = ev.request_id
        else:
            return
        decode = self.decode_of.pop(rid, None)
        if decode is not None:
            self.num_requests[decode] -= 1


@register("pd_joint", "lbbench's P/D: short uncached prompts served whole, the others on the (prefill, decode) pair "
                      "or the whole-serving decode instance of least predicted cost (prefill queue and speed, the KV "
                      "transfer, decode speed, the stall a local prefill imposes on the requests decoding there)")
class PdJoint(_PairRouter):
    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 short_prompt_tokens: int = 16, kv_link: str = DEFAULT_LINK,
                 kv_bytes_per_token: float | None = None, interference: float = 1.0, **kw: Any):
        super().__init__(num_instances, seed, profile=profile, **kw)
        self.short_prompt_tokens = int(short_prompt_tokens)
        self.interference = float(interference)
        self.link = parse_kv_link(str(kv_link))
        if kv_bytes_per_token is None:  # the profile's (Llama-3.1-8B's 128 KiB without one)
            kv_bytes_per_token = profile_kv_bytes_per_token(profile) if profile is not None else 131072.0
        self.kv_bytes_per_token = float(kv_bytes_per_token)
        self.committed = _Committed(num_instances)

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.committed = _Committed(self.num_instances)

    def on_event(self, ev: Event) -> None:
        self.committed.on_event(ev)

    @staticmethod
    def _prefill_s(iv: InstanceView, tokens: int) -> float:
        """Time until ``tokens`` more prompt tokens are prefilled on ``iv``, behind its backlog."""
        return (iv.prompt_tokens_pending + tokens) / iv.spec.prefill_tokens_per_s + iv.spec.min_step_s

    @staticmethod
    def _decode_s(iv: InstanceView, request: Request) -> float:
        """Its decode on ``iv``: a step takes the minimum step plus a share of the batch decode speed per sequence
        there (every outstanding request, those still arriving with their KV included, and this one)."""
        spec = iv.spec
        per_token_s = spec.min_step_s + (iv.num_outstanding + 1) / spec.batch_decode_tokens_per_s
        return request.expected_output_tokens * per_token_s

    def predicted_s(self, request: Request, view: ClusterView, decode: int, prefill: int | None) -> float:
        """Predicted completion time (seconds from now) of ``request`` decoded on ``decode``, prefilled on
        ``prefill`` (None: whole on ``decode``)."""
        d = view.instances[decode]
        if prefill is None:
            return self._prefill_s(d, self.uncached_tokens(decode, request)) + self._decode_s(d, request)
        p = view.instances[prefill]
        transfer_s = self.link.transfer_s(max(0, request.prompt_tokens - 1) * self.kv_bytes_per_token)
        return (self._prefill_s(p, self.uncached_tokens(prefill, request)) + transfer_s
                + d.prompt_tokens_pending / d.spec.prefill_tokens_per_s + self._decode_s(d, request))

    def num_stalled(self, view: ClusterView, decode: int, tokens: int) -> float:
        """How many requests decode on ``decode`` while it prefills ``tokens`` more prompt tokens behind its
        backlog: those there now, and those it was paired with whose KV lands before that prefill is done. Their
        KV is assumed to land evenly until the prefill instances have done their backlog."""
        d = view.instances[decode]
        window_s = (d.prompt_tokens_pending + tokens) / d.spec.prefill_tokens_per_s
        drain_s = max((iv.prompt_tokens_pending / iv.spec.prefill_tokens_per_s + iv.spec.min_step_s
                       for iv in view.instances if iv.healthy and iv.spec.role == "prefill"), default=0.0)
        landing = 1.0 if drain_s <= window_s else window_s / drain_s
        return d.num_outstanding + self.committed.num_requests[decode] * landing

    def cost_s(self, request: Request, view: ClusterView, decode: int, prefill: int | None) -> float:
        """What ``route`` minimises: the predicted completion, plus, served whole, the stall its prefill imposes
        on the requests decoding there meanwhile (each waits out the prefill, ``num_stalled``)."""
        t = self.predicted_s(request, view, decode, prefill)
        if prefill is None:
            d, tokens = view.instances[decode], self.uncached_tokens(decode, request)
            t += self.interference * self.num_stalled(view, decode, tokens) * tokens / d.spec.prefill_tokens_per_s
        return t

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> PairDecision | None:
        r = queue[0]
        prefill_group, decode_group = role_groups(view)
        if not decode_group:
            return None
        options: list[tuple[int | None, int]] = [(None, d) for d in decode_group]
        if prefill_group and min(self.uncached_tokens(i, r) for i in decode_group) > self.short_prompt_tokens:
            options += [(p, d) for p in prefill_group for d in decode_group]
        p, d = min(options, key=lambda o: (self.cost_s(r, view, o[1], o[0]), o[0] is None, o[0] or 0, o[1]))
        if p is not None:
            self.committed.sent(r, d)
        return self.decide(r, d, p)
