"""What a router remembers sending where: per instance, an approximate prefix tree.

A gateway cannot see an engine's prefix cache; it can only remember which
prompts it sent to which instance, and assume their KV is still there. Each
instance gets a tree of the prefix-hash chains of the prompts sent to it (a
node per hash block: the chain up to and including it), in order of last use;
the longest chain of a new prompt found in an instance's tree is its expected
cache hit there. Trees are bounded in tokens: the least recently used nodes go
first, leaves before their parents (a prompt's deeper nodes are touched first,
so its root is the most recent).

Only the hashes that cover the prompt are used (a session turn's hashes also
name its future answer, which a gateway cannot know).

A node names one block of the request's own hashes (its ``prefix_block_tokens``), or, when the tree is given
``block_tokens``, one block of that size cut from them (``lbbench.prefix_blocks``) with the prompt's incomplete
tail block keyed too: llm-d's prefix index hashes 64-token blocks of the prompt, its tail included.
"""

from __future__ import annotations

from collections import OrderedDict

from ..core import DEFAULT_PREFIX_BLOCK_TOKENS, Request
from ..prefix_blocks import block_keys, leading_matches
from ..profiles import Profile


def prompt_chains(request: Request, block_tokens: int | None = None) -> tuple[list[int], int]:
    """The request's prefix-hash chain over its prompt, and the tokens per node: one node per hash, or per
    ``block_tokens`` block (the prompt's incomplete tail block included)."""
    if block_tokens is not None:
        return block_keys(request, block_tokens, partial=True), block_tokens
    g = request.prefix_block_tokens or DEFAULT_PREFIX_BLOCK_TOKENS
    hashes = request.prefix_hashes
    if not hashes:
        return [], g
    n = min(len(hashes), -(-request.prompt_tokens // g))
    chains, c = [], 0
    for h in hashes[:n]:
        c = hash((c, int(h)))
        chains.append(c)
    return chains, g


def lru_bound(lru_tokens: int | None, profile: Profile | None) -> int:
    """The tokens a router's prefix view keeps per instance: ``lru_tokens`` when set, else the profile's KV
    capacity (2^20 without a profile)."""
    return int(lru_tokens or (profile.kv_capacity_tokens if profile is not None else 1 << 20))


class PrefixTrees:
    """One bounded LRU prefix tree per instance, keyed by hash chains."""

    def __init__(self, num_instances: int, max_tokens: int, block_tokens: int | None = None):
        self.max_tokens = max_tokens
        self.block_tokens = block_tokens
        #: per instance: chain -> tokens its block names, least recently used first
        self.trees: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(num_instances)]
        self.tokens = [0] * num_instances
        self._memo: tuple[int, list[int], int] | None = None  # (request id, chains, tokens per hash)

    def __deepcopy__(self, memo: dict) -> "PrefixTrees":
        """A separate copy in one C-level copy per tree (keys and sizes are ints): a planner copies a router's
        trees into every rollout."""
        new = PrefixTrees.__new__(PrefixTrees)
        new.max_tokens, new.block_tokens, new._memo = self.max_tokens, self.block_tokens, None
        new.trees = [t.copy() for t in self.trees]
        new.tokens = list(self.tokens)
        return new

    def _chains(self, request: Request) -> tuple[list[int], int]:
        m = self._memo
        if m is not None and m[0] == request.request_id:
            return m[1], m[2]
        chains, g = prompt_chains(request, self.block_tokens)
        self._memo = (request.request_id, chains, g)
        return chains, g

    def match_blocks(self, instance: int, request: Request) -> int:
        """Leading nodes of ``request``'s prompt found in ``instance``'s tree."""
        chains, _ = self._chains(request)
        return leading_matches(chains, self.trees[instance])

    def match_tokens(self, instance: int, request: Request) -> int:
        """Prompt tokens of ``request`` expected cached on ``instance``."""
        return min(self.match_blocks(instance, request) * self._chains(request)[1], request.prompt_tokens)

    def match_rates(self, request: Request) -> list[float]:
        p = max(1, request.prompt_tokens)
        return [self.match_tokens(i, request) / p for i in range(len(self.trees))]

    def insert(self, instance: int, request: Request, evict: bool = True) -> None:
        chains, g = self._chains(request)
        tree = self.trees[instance]
        for c in reversed(chains):  # deepest first: a prompt's root ends up the most recent
            if c in tree:
                tree.move_to_end(c)
            else:
                tree[c] = g
                self.tokens[instance] += g
        if evict:
            self.evict(instance)

    def evict(self, instance: int, max_tokens: int | None = None) -> None:
        """Drop least recently used nodes until the tree holds at most ``max_tokens``."""
        limit = self.max_tokens if max_tokens is None else max_tokens
        tree = self.trees[instance]
        while self.tokens[instance] > limit and tree:
            self.tokens[instance] -= tree.popitem(last=False)[1]
