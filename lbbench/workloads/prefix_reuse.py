"""The prefix reuse a workload intends: the share of prompt tokens an infinite prefix cache would serve.

A run with prefix caching reports the hit rate it achieved (``cached_prompt_tokens`` / prompt tokens). Whether
that is good depends on what the traffic offers: a trace of unrelated prompts offers nothing, an agent loop re-sends
almost its whole context. This module computes what the requests offer, from their prefix hashes alone: in arrival
order, each request's prompt is cut into the engine's blocks (``lbbench.prefix_blocks``), its leading blocks already
seen in an earlier request's token stream (prompt and answer: an engine caches both) are hits, at least one prompt
token is always computed (as vLLM does), and then its own stream is added to the cache. Nothing is ever evicted,
and a block counts as cached as soon as an earlier request named it, so the rate is an upper bound on what any
router and any cache size achieve.

A workload *intends* reuse when it is built to share prefixes (sessions, shared prefixes, agents) or when its
requests continue conversations (a later turn re-sends the earlier ones). Such a workload that names no hashes
cannot be served from the cache at all: vLLM's benchmark once replayed only the first turn of ShareGPT
conversations and measured 0 % reuse on a multi-turn dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..core import Request
from ..prefix_blocks import block_keys

#: ``--workload`` kinds built to share prefixes
REUSE_WORKLOADS = ("sessions", "shared-prefix", "inference-perf", "agentic")


@dataclass(frozen=True)
class ReuseIntent:
    """What a run's requests offer a prefix cache."""

    #: share of prompt tokens an infinite cache would serve; None when no request names prefix hashes
    intended_rate: float | None
    #: the workload is built to share prefixes, or continues conversations
    intends_reuse: bool
    #: the engine block size the rate was computed at
    block_tokens: int

    @property
    def names_no_hashes(self) -> bool:
        """Reuse is intended but no request says what its tokens are: no cache can serve any of it."""
        return self.intends_reuse and self.intended_rate is None


def intended_hit_rate(requests: Iterable[Request], block_tokens: int) -> float | None:
    """Share of prompt tokens an infinite cache of ``block_tokens``-token blocks would serve, the requests taken in
    arrival order; None when no request names prefix hashes."""
    reqs = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    if not any(r.prefix_hashes for r in reqs):
        return None
    seen: set[int] = set()
    hit = total = 0
    for r in reqs:
        total += r.prompt_tokens
        stream = block_keys(r, block_tokens, limit_tokens=r.prompt_tokens + r.output_tokens)
        n = 0
        for key in stream[:r.prompt_tokens // block_tokens]:
            if key not in seen:
                break
            n += 1
        hit += min(n * block_tokens, max(0, r.prompt_tokens - 1))
        seen.update(stream)
    return hit / total if total else None


def reuse_intent(requests: list[Request], block_tokens: int, declared: bool = False) -> ReuseIntent:
    """The reuse ``requests`` offer; ``declared``: the workload was built to share prefixes (``REUSE_WORKLOADS``)."""
    continues = any((r.turn or 0) > 0 for r in requests)
    return ReuseIntent(intended_hit_rate(requests, block_tokens), declared or continues, block_tokens)


def declares_reuse(workload: str | None) -> bool:
    """Whether a ``--workload`` spec is one of the kinds built to share prefixes."""
    return bool(workload) and workload.split(":", 1)[0] in REUSE_WORKLOADS  # type: ignore[union-attr]
