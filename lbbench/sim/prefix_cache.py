"""Automatic prefix caching for one simulated instance, as vLLM V1 does it.

- A request's token stream is cut into full ``block_size``-token blocks; block
  ``b`` is keyed by a hash chain over everything up to its end, so two requests
  share a block exactly when they share every token up to it. The chain comes
  from the request's ``prefix_hashes`` (each naming ``prefix_block_tokens``
  tokens); tokens past them are the request's own.
- At admission the longest run of cached leading blocks is reused (at least one
  token is always computed, as in vLLM); only the rest is prefilled.
- Blocks are reference counted. A block nobody holds goes to the *free queue*
  but keeps its contents; an allocation takes the queue's head, evicting what
  was cached there (LRU among free blocks, vLLM's ``FreeKVCacheBlockQueue``).
  Freed blocks enter the queue tail-first (a request's last block is evicted
  before its first).
- A request's own blocks (not named by hashes) enter the queue as one group;
  after a preemption the request can reuse what is left of it, a finished
  request's group is just free space.

Eviction is lazy: the instance's fast decode path allocates blocks by counting
(``KVBlockManager.num_used_blocks``), and ``settle(free)`` pops the queue head
until the queue holds no more blocks than are free, before anything looks at or
adds to the queue. That gives the same state as evicting at every allocation,
since the head is only ever read after settling.

This is the part of the block manager (``block_manager.py``) that vLLM calls its
``BlockPool``: the free queue and the map of cached blocks. It publishes KV
events (``kv_events.py``) through ``emit`` when someone subscribes: a
``BlockStored`` per run of newly cached blocks, a ``BlockRemoved`` per settle
that evicted cached ones.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

from ..core import Request
from ..prefix_blocks import block_keys as prefix_block_keys
from .kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVEventCallback



def block_keys(request: Request, block_size: int) -> list[int]:
    """The engine's keys of ``request``: its full ``block_size``-token blocks over prompt and output, as far as
    its prefix hashes name them (``lbbench.prefix_blocks``, the one hash chain routers and workloads use too)."""
    return prefix_block_keys(request, block_size, limit_tokens=request.prompt_tokens + request.output_tokens)


class Hit:
    """What an admission would reuse: ``named`` leading keyed blocks, ``own`` blocks of the
    request's group left from a preemption; ``from_free`` of them sit in the free queue. ``cpu``:
    the blocks after them that a CPU tier can load (``offload.py``; set by the block manager)."""

    __slots__ = ("named", "own", "from_free", "cpu")

    def __init__(self, named: int, own: int, from_free: int, cpu: int = 0):
        self.named, self.own, self.from_free, self.cpu = named, own, from_free, cpu

    @property
    def blocks(self) -> int:
        return self.named + self.own


class PrefixCache:
    """Reference counts of cached blocks and the free-block queue of one instance."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        #: key -> number of running requests holding the block; 0: cached and in the free queue
        self.ref: dict[int, int] = {}
        #: the free queue, head first: entry id -> [key or None, blocks, owner request id or None]
        self.queue: OrderedDict[int, list[Any]] = OrderedDict()
        self.queue[0] = [None, num_blocks, None]
        self.where: dict[int, int] = {}  # key with ref 0 -> its queue entry
        self.num_queued = num_blocks  # blocks in the queue; the excess over the free blocks awaits eviction
        self.num_shared = 0  # sum over held keys of (ref - 1): blocks counted once though held more often
        self.num_evicted = 0
        self.hit_tokens = 0  # first admissions only (what vLLM's hit rate counts)
        self.query_tokens = 0
        self.preempted_hit_tokens = 0  # re-admissions after a preemption
        self._next_entry = 1
        self.version = 0  # bumped whenever what ``peek`` sees may have changed
        self.num_blocks = num_blocks
        #: where KV events go (the block manager's publisher); None: nobody subscribed, nothing is built
        self.emit: KVEventCallback | None = None

    def fork(self) -> "PrefixCache":
        """An independent copy (its entries name requests by id only); it publishes no events."""
        emit, self.emit = self.emit, None
        try:
            return copy.deepcopy(self)
        finally:
            self.emit = emit

    # ------------------------------------------------------------------ queue
    def _push(self, key: int | None, blocks: int, owner: int | None) -> int:
        eid = self._next_entry
        self._next_entry += 1
        self.version += 1
        self.queue[eid] = [key, blocks, owner]
        self.num_queued += blocks
        if key is not None:
            self.where[key] = eid
        return eid

    def settle(self, free_blocks: int) -> None:
        """Evict from the queue head until it holds no more than ``free_blocks`` blocks."""
        excess = self.num_queued - free_blocks
        if excess <= 0:
            return
        self.version += 1
        queue = self.queue
        evicted: list[int] | None = [] if self.emit is not None else None
        while excess > 0:
            eid, entry = next(iter(queue.items()))
            key = entry[0]
            if key is not None:
                del queue[eid]
                del self.ref[key]
                del self.where[key]
                self.num_queued -= 1
                self.num_evicted += 1
                excess -= 1
                if evicted is not None:
                    evicted.append(key)
                continue
            take = min(entry[1], excess)
            entry[1] -= take
            self.num_queued -= take
            excess -= take
            if entry[1] == 0:
                del queue[eid]
        if evicted:
            self.emit(BlockRemoved(tuple(evicted), MEDIUM_GPU))  # type: ignore[misc]

    # ------------------------------------------------------------------ admission
    def peek(self, r: Any) -> Hit:
        """The reuse available to ``r`` (not yet admitted, nothing computed) right now."""
        memo = r.hit_memo
        if memo is not None and memo[0] == self.version:
            return memo[1]
        hit = self._peek(r)
        r.hit_memo = (self.version, hit)
        return hit

    def _peek(self, r: Any) -> Hit:
        ref = self.ref
        max_hit = (r.num_tokens - 1) // self.block_size
        named = from_free = 0
        for key in r.keys:
            if named >= max_hit:
                break
            n = ref.get(key)
            if n is None:
                break
            named += 1
            if n == 0:
                from_free += 1
        own = 0
        entry = self.queue.get(r.own_entry) if r.own_entry is not None else None
        if entry is not None and named == r.n_named_prev:
            own = min(entry[1], max_hit - named)
            from_free += own
        return Hit(named, own, from_free)

    def acquire(self, r: Any, hit: Hit) -> None:
        """Admit ``r`` with ``hit``: hold its blocks, take them out of the free queue."""
        self.version += 1
        ref = self.ref
        held = r.keys[:hit.named]
        for key in held:
            n = ref[key]
            if n:
                self.num_shared += 1
            else:
                del self.queue[self.where.pop(key)]
                self.num_queued -= 1
            ref[key] = n + 1
        r.held = list(held)
        r.n_reg = hit.named
        if r.own_entry is not None:
            entry = self.queue.get(r.own_entry)
            if entry is not None:
                entry[2] = None  # what is left of the group is plain free space now
                if hit.own:
                    entry[1] -= hit.own
                    self.num_queued -= hit.own
                    if entry[1] == 0:
                        del self.queue[r.own_entry]
            r.own_entry = None
        tokens = hit.blocks * self.block_size
        if r.num_preemptions == 0:
            self.query_tokens += r.prompt_tokens
            self.hit_tokens += tokens
            r.cached_tokens = tokens
        else:
            self.preempted_hit_tokens += tokens

    def count_miss(self, r: Any) -> None:
        """``r`` is admitted with nothing to reuse (it names no blocks and has no group left)."""
        if r.num_preemptions == 0:
            self.query_tokens += r.prompt_tokens
            r.cached_tokens = 0

    def register(self, r: Any, full_blocks: int) -> None:
        """``r``'s first ``full_blocks`` blocks are (being) computed: cache the keyed ones."""
        stop = min(full_blocks, len(r.keys))
        if r.n_reg >= stop:
            return
        self.version += 1
        ref = self.ref
        if self.emit is None:
            for key in r.keys[r.n_reg:stop]:
                if key not in ref:  # a copy cached elsewhere (its chain was broken) stays the only one
                    ref[key] = 1
                    r.held.append(key)
        else:
            self._register_publishing(r, stop)
        r.n_reg = stop

    def _register_publishing(self, r: Any, stop: int) -> None:
        """``register``'s loop, publishing one ``BlockStored`` per run of newly cached blocks."""
        ref, keys, bs = self.ref, r.keys, self.block_size
        run: list[int] = []
        parent = keys[r.n_reg - 1] if r.n_reg else None
        for i in range(r.n_reg, stop):
            key = keys[i]
            if key not in ref:
                ref[key] = 1
                r.held.append(key)
                run.append(key)
                continue
            if run:
                self.emit(BlockStored(tuple(run), parent, len(run) * bs, bs, MEDIUM_GPU))  # type: ignore[misc]
                run = []
            parent = key
        if run:
            self.emit(BlockStored(tuple(run), parent, len(run) * bs, bs, MEDIUM_GPU))  # type: ignore[misc]

    def release(self, r: Any, full_blocks: int, blocks: int, preempted: bool) -> int:
        """``r`` gives back its ``blocks`` (``full_blocks`` of them full). Returns how many
        blocks became free (shared ones stay with their other holders). Settle first."""
        self.register(r, full_blocks)
        held = r.held
        own = blocks - len(held)
        keep = preempted and len(held) == r.n_reg  # its own blocks follow its keyed ones
        r.own_entry = self._push(None, own, r.rid) if own > 0 and keep else None
        if own > 0 and not keep:
            self._push(None, own, None)
        r.n_named_prev = r.n_reg if keep else -1
        freed = own
        ref = self.ref
        for key in reversed(held):
            n = ref[key] - 1
            ref[key] = n
            if n:
                self.num_shared -= 1
            else:
                self._push(key, 1, None)
                freed += 1
        r.held = []
        r.n_reg = 0
        return freed

    def reset(self) -> None:
        """Drop every cached block (nothing may be held): the queue is plain free space again."""
        assert not any(self.ref.values()) and self.num_shared == 0, "reset with blocks held"
        self.ref.clear()
        self.where.clear()
        self.queue.clear()
        self.num_queued = 0
        self._push(None, self.num_blocks, None)
        if self.emit is not None:
            self.emit(AllBlocksCleared())

    # ------------------------------------------------------------------ checks
    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def check(self, running: list[Any], free_blocks: int) -> None:
        """Invariants (tests): the queue holds exactly the unheld cached keys and the free
        space; no block is both in use and free or evicted; counts add up."""
        assert self.num_queued >= free_blocks, (self.num_queued, free_blocks)
        assert self.num_queued == sum(e[1] for e in self.queue.values())
        for eid, (key, _, _) in self.queue.items():
            if key is not None:
                assert self.ref.get(key) == 0 and self.where.get(key) == eid, "queued key held or unknown"
        holders: dict[int, int] = {}
        for r in running:
            for key in r.held:
                holders[key] = holders.get(key, 0) + 1
        for key, n in self.ref.items():
            assert n == holders.get(key, 0), (key, n, holders.get(key, 0))
            assert (n == 0) == (key in self.where), "a held block is in the free queue"
        assert self.num_shared == sum(n - 1 for n in holders.values())
