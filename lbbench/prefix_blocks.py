"""A request's token stream cut into blocks of any size, each block keyed by everything up to its end.

A request names its content with ``prefix_hashes``: hash ``j`` names tokens ``[j*g, (j+1)*g)`` of its token
stream, ``g`` its ``prefix_block_tokens`` (``lbbench.core``). Engines and routers cut the same stream at their own
block size ``B``: vLLM's KV blocks (16 tokens by default), Dynamo's router blocks (the engine's), llm-d's prefix
index (64 tokens at least). Block ``k`` covers tokens ``[k*B, (k+1)*B)``; its key folds every hash up to the one
holding its last token into a chain, then adds the block's end, so two requests share a key exactly when they share
every token up to the block's end (equal hashes at equal positions mean equal tokens). The same convention keys the
simulator's prefix cache, so a key here equals the engine's key of that block.

- Only tokens the hashes cover are keyed: past the last hash the content is the request's own (unknown), and
  such tokens never match anything.
- ``partial``: the last, incomplete block of ``limit_tokens`` is keyed too (by its end): llm-d hashes a prompt's
  tail block as it is, so two prompts match there only when they end at the same token.

It sits beside ``core`` because routers (their prefix views) and workloads (the hit rate a workload intends) both
cut streams, and neither may import the other's package.
"""

from __future__ import annotations

from typing import Container, Iterable

from .core import DEFAULT_PREFIX_BLOCK_TOKENS, Request


def block_keys(request: Request, block_tokens: int, limit_tokens: int | None = None,
               partial: bool = False) -> list[int]:
    """Keys of ``request``'s ``block_tokens``-token blocks over its first ``limit_tokens`` tokens (default: the
    prompt), as far as its prefix hashes cover them; full blocks only unless ``partial``."""
    hashes = request.prefix_hashes
    if not hashes:
        return []
    g = request.prefix_block_tokens or DEFAULT_PREFIX_BLOCK_TOKENS
    limit = request.prompt_tokens if limit_tokens is None else limit_tokens
    covered = min(len(hashes) * g, limit)
    ends = list(range(block_tokens, covered + 1, block_tokens))
    if partial and covered == limit and covered % block_tokens:
        ends.append(covered)
    keys: list[int] = []
    chain = 0
    done = -1  # hashes folded into ``chain`` so far
    for end in ends:
        j = (end - 1) // g
        while done < j:
            done += 1
            chain = hash((chain, int(hashes[done])))
        keys.append(hash((chain, end)))
    return keys


def num_blocks(tokens: int, block_tokens: int, partial: bool = False) -> int:
    """Blocks of ``block_tokens`` in ``tokens`` tokens: the full ones, plus the incomplete tail if ``partial``."""
    return -(-tokens // block_tokens) if partial else tokens // block_tokens


def leading_matches(keys: Iterable[int], held: Container[int]) -> int:
    """How many of ``keys``, from the first, ``held`` holds before the first it does not (a prefix match)."""
    n = 0
    for k in keys:
        if k not in held:
            break
        n += 1
    return n
