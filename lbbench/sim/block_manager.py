"""The KV block manager of one simulated instance, apart from its scheduler, as vLLM v1 keeps them apart.

vLLM v1's ``Scheduler`` forms each step's batch and asks its ``KVCacheManager`` for room: ``allocate_slots``
returns the new blocks, or ``None`` when they do not fit and the scheduler preempts (vLLM-project/vllm,
``vllm/v1/core/sched/scheduler.py`` at 00024d314514900f361ad072af6931e403b7f589 and
``vllm/v1/core/kv_cache_manager.py`` at 003df2961dd8830c317a61f9745ccd557da9fa06, Apache-2.0). The
simulator keeps that split. ``KVBlockManager`` owns:

- the block counts: ``num_blocks`` of ``block_size`` tokens, ``num_used_blocks``, each request's ``blocks``;
- the admission watermark (vLLM V0's, and V1's ``watermark_blocks``): blocks kept free when a waiting request
  is admitted beside running ones;
- the prefix cache (``prefix_cache.py``, the part vLLM calls ``BlockPool``: prefix hashes, reference counts,
  the free queue and LRU eviction), when prefix caching is on;
- the decode histogram: decoding requests counted by ``(num_computed - clock) mod block_size``, so that the
  blocks a pure-decode step needs (and how many such steps fit) are known in O(1) or O(block_size) rather
  than per request. The scheduler's step clock drives it, the manager owns it;
- KV events (``kv_events.py``): ``subscribe(callback)`` and every cached block stored or evicted is
  published, as vLLM's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``; nothing is built while
  nobody subscribes;
- the CPU tier (``offload.py``, when the profile asks for one): every full keyed block is stored to it as it
  is computed, and ``lookup`` reports the blocks after the GPU hit that it can load; ``allocate_load``
  starts such a load, ``finish_load`` caches the loaded blocks on the GPU when it is done;
- export and import of a request's blocks (``export``, ``import_blocks``), for a KV transfer between
  instances.

The scheduler (``scheduler.py``) asks for room and gives it back: ``lookup`` and ``allocate_slots`` (an
admission or a prefill chunk), ``allocate_decode_block`` (one decoding request at a block boundary),
``max_decode_steps`` and ``allocate_decode_steps`` (how many pure-decode steps fit, and their blocks),
``start_decoding`` (the histogram), ``free`` and ``free_decoding``. A method that can fail returns ``None``
or ``False`` and leaves the state as it was. Two of the scheduler's hottest paths count blocks inline, on the
manager's own state and marked as such in ``scheduler.py``: the block demand of a pure-decode step
(``hist[(-clock) % block_size]`` blocks, allocated when they fit) and, when every running request decodes,
one block per request at a boundary. Nothing else outside this module and ``prefix_cache.py`` writes a
block count.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import TYPE_CHECKING, Iterable, Sequence

from .kv_events import KVCacheEvent, KVEventCallback
from .offload import CpuTier
from .prefix_cache import Hit, PrefixCache, block_keys
from .request import SimRequest

if TYPE_CHECKING:
    from ..core import Request


class KVBlockManager:
    """Paged KV blocks of one instance: counts, the decode histogram, the prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = False,
                 watermark_blocks: int = 0, cpu: CpuTier | None = None, bytes_per_block: float = 0.0):
        self.num_blocks = num_blocks
        self.block_size = block_size
        #: bytes of one block's KV (all layers), what a transfer of it carries; 0 when unknown
        self.bytes_per_block = bytes_per_block
        #: blocks kept free when a waiting request is admitted while others run
        self.watermark_blocks = watermark_blocks
        self.num_used_blocks = 0
        #: decoding requests by (num_computed - clock) mod block_size: hist[(-clock) % block_size] of them
        #: need a new block in the step at ``clock``
        self.hist = [0] * block_size
        self.cache: PrefixCache | None = PrefixCache(num_blocks, block_size) if prefix_caching else None
        if cpu is not None and self.cache is None:
            raise ValueError("a CPU KV tier finds blocks by their prefix hashes: it needs prefix caching")
        self.cpu = cpu
        self._subscribers: list[KVEventCallback] = []

    # ------------------------------------------------------------------ KV events
    def subscribe(self, callback: KVEventCallback) -> None:
        """Call ``callback(event)`` for every KV event from now on (in order, as they happen)."""
        self._subscribers.append(callback)
        self._wire(self._publish)

    def unsubscribe(self, callback: KVEventCallback) -> None:
        self._subscribers.remove(callback)
        if not self._subscribers:
            self._wire(None)

    def _wire(self, emit: KVEventCallback | None) -> None:
        for part in (self.cache, self.cpu):
            if part is not None:
                part.emit = emit

    def _publish(self, ev: KVCacheEvent) -> None:
        for callback in self._subscribers:
            callback(ev)

    def cached_hashes(self) -> set[int]:
        """The keys of the blocks the prefix cache holds now (evictions due are made, and published, first)."""
        cache = self.cache
        if cache is None:
            return set()
        cache.settle(self.num_blocks - self.num_used_blocks)
        return set(cache.ref)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block (vLLM's ``reset_prefix_cache``, publishing ``AllBlocksCleared``); refused
        (False, nothing changed) while any block is in use, as vLLM refuses it."""
        if self.num_used_blocks or self.cache is None:
            return False
        if self.cpu is not None:
            self.cpu.clear()
        self.cache.reset()
        return True

    # ------------------------------------------------------------------ what a scheduler or a router reads
    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_used_blocks

    @property
    def usage(self) -> float:
        """Share of the blocks in use (vLLM's ``kv_cache_usage``)."""
        return self.num_used_blocks / self.num_blocks

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Share of prompt tokens reused from the cache at first admission (None: caching off)."""
        return self.cache.hit_rate if self.cache is not None else None

    # ------------------------------------------------------------------ a request's lifetime
    def add_request(self, r: SimRequest) -> None:
        """``r`` reaches the instance: name its blocks by their prefix keys (prefix caching on)."""
        if self.cache is not None:
            r.keys = block_keys(r.request, self.block_size)

    def num_cached_prompt_tokens(self, request: Request, keys: Sequence[int] | None = None) -> int:
        """The prompt tokens of ``request`` whose blocks the prefix cache holds now (leading full blocks, at most
        all but the prompt's last token, as ``lookup`` reuses them; no eviction is settled, nothing changes). 0 with
        caching off. ``keys``: the request's block keys when known (``block_keys`` otherwise)."""
        cache = self.cache
        if cache is None:
            return 0
        bs = self.block_size
        ref = cache.ref
        n, max_hit = 0, (request.prompt_tokens - 1) // bs
        for key in (block_keys(request, bs) if keys is None else keys):
            if n >= max_hit or key not in ref:
                break
            n += 1
        return n * bs

    def lookup(self, r: SimRequest) -> Hit | None:
        """The cached blocks an admission of ``r`` would reuse (vLLM's ``get_computed_blocks``), or None when
        there is nothing to look up (caching off, ``r`` has computed tokens, names no block and has no blocks
        left from a preemption)."""
        cache = self.cache
        if cache is None or r.num_computed or not (r.keys or r.own_entry is not None):
            return None
        cache.settle(self.num_blocks - self.num_used_blocks)
        hit = cache.peek(r)
        cpu = self.cpu
        if cpu is None or not r.keys:
            return hit
        keys = r.keys
        cpu.touch(keys[:r.num_tokens // self.block_size])  # vLLM touches the request's blocks at every lookup
        if hit.own:
            return hit
        n = cpu.lookup(keys, hit.named, min(len(keys), (r.num_tokens - 1) // self.block_size))
        return Hit(hit.named, 0, hit.from_free, n) if n else hit

    def allocate_slots(self, r: SimRequest, num_new_tokens: int, hit: Hit | None = None,
                       reserve_blocks: int = 0) -> int | None:
        """Room for ``num_new_tokens`` more tokens of ``r`` (not decoding), after ``r.num_computed`` or, with
        a cache ``hit`` (``lookup``), after the hit's blocks, which ``r`` then holds; ``reserve_blocks`` stay
        free. Returns the blocks added, or None (nothing changed) when they do not fit. The full blocks the
        new tokens complete are cached."""
        bs = self.block_size
        if hit is None:
            computed, held, taken = r.num_computed, r.blocks, 0
        else:
            computed, held, taken = hit.blocks * bs, hit.blocks, hit.from_free
        grow = -(-(computed + num_new_tokens) // bs) - held
        if grow < 0:  # a request back from a CPU load holds blocks for its whole prompt already
            grow = 0
        if grow + taken > self.num_blocks - self.num_used_blocks - reserve_blocks:
            return None
        cache = self.cache
        if hit is not None:
            cache.acquire(r, hit)  # type: ignore[union-attr]
            r.blocks = held
            self.num_used_blocks += taken
        elif cache is not None and computed == 0:
            cache.count_miss(r)
        self.num_used_blocks += grow
        r.blocks += grow
        if cache is not None and r.keys:  # the new blocks came off the free queue's head first
            cache.settle(self.num_blocks - self.num_used_blocks)
            cache.register(r, (computed + num_new_tokens) // bs)
            if self.cpu is not None:
                self._store(r, (computed + num_new_tokens) // bs)
        return grow

    def allocate_decode_block(self) -> bool:
        """One block for a decoding request whose next token starts a block; False when none is free."""
        if self.num_used_blocks >= self.num_blocks:
            return False
        self.num_used_blocks += 1
        return True

    def free_decode_block(self) -> None:
        """Give back a block ``allocate_decode_block`` (or a decode step's demand) handed out for a step
        that its request will not run (it left)."""
        self.num_used_blocks -= 1

    def free(self, r: SimRequest, preempted: bool = False) -> None:
        """``r`` (not decoding) gives its blocks back; its full keyed blocks stay cached in the free queue,
        and after a preemption what is left of its own blocks stays reusable by it (prefix caching on)."""
        cache = self.cache
        if cache is None:
            self.num_used_blocks -= r.blocks
        else:
            cache.settle(self.num_blocks - self.num_used_blocks)
            self.num_used_blocks -= cache.release(r, r.num_computed // self.block_size, r.blocks, preempted)
            if self.cpu is not None and r.keys:
                self._store(r, r.num_computed // self.block_size)
        r.blocks = 0

    # ------------------------------------------------------------------ export / import (KV transfer)
    def export(self, r: SimRequest, num_computed: int) -> tuple[int, tuple[int, ...], float]:
        """What a transfer of ``r``'s KV (``num_computed`` tokens) carries: its block count, the keys of its
        full keyed blocks, and its bytes (``bytes_per_block`` each; 0 when the profile does not say)."""
        num_blocks = -(-num_computed // self.block_size)
        keys = tuple(r.keys[:num_computed // self.block_size]) if self.cache is not None else ()
        return num_blocks, keys, num_blocks * self.bytes_per_block

    def import_blocks(self, r: SimRequest, num_computed: int) -> int | None:
        """``r`` arrives with the KV of ``num_computed`` tokens computed elsewhere: allocate its blocks as
        computed, with room for its next token, so that it runs without prefill. Its full keyed blocks are
        cached here (and stored to the CPU tier). Returns the blocks allocated, or None (nothing changed)
        when they do not fit."""
        bs = self.block_size
        grow = -(-(num_computed + 1) // bs)
        if grow > self.num_blocks - self.num_used_blocks:
            return None
        self.num_used_blocks += grow
        r.blocks = grow
        cache = self.cache
        if cache is not None and r.keys:
            cache.settle(self.num_blocks - self.num_used_blocks)
            cache.register(r, num_computed // bs)
            if self.cpu is not None:
                self._store(r, num_computed // bs)
        return grow

    # ------------------------------------------------------------------ the CPU tier
    def _store(self, r: SimRequest, full_blocks: int) -> None:
        """Store ``r``'s computed full keyed blocks not stored yet (vLLM's per-step store of a request)."""
        stop = min(full_blocks, len(r.keys))
        if r.n_stored >= stop:
            return
        cpu = self.cpu
        stored = cpu.store(r.keys[r.n_stored:stop])  # type: ignore[union-attr]
        if stored is None:
            return  # no room: the next blocks try again
        r.n_stored = stop
        if stored:
            cpu.touch(r.keys[:stop])  # type: ignore[union-attr]

    def allocate_load(self, r: SimRequest, hit: Hit, reserve_blocks: int, now_s: float) -> float | None:
        """Admit ``r`` to load ``hit.cpu`` blocks from the CPU tier after its GPU hit; returns when the load
        completes, or None (nothing changed) when the blocks do not fit. ``r`` holds the hit's blocks, new
        blocks for the loaded ones and, unlike vLLM, those for the rest of its prompt too, from now on: a
        request back from a load then needs no block to be admitted, so requests waiting with blocks can
        never hold what the one ahead of them needs while nothing runs (vLLM can hang there). Its cached
        prompt tokens count the GPU hit and the loaded blocks."""
        bs = self.block_size
        taken, grow = hit.from_free, -(-r.num_tokens // bs) - hit.named
        if grow + taken > self.num_blocks - self.num_used_blocks - reserve_blocks:
            return None
        cache, cpu = self.cache, self.cpu
        cache.acquire(r, hit)  # type: ignore[union-attr]
        if r.num_preemptions == 0:
            r.cached_tokens = (hit.named + hit.cpu) * bs
        r.blocks = hit.named + grow
        r.n_loading = hit.cpu
        self.num_used_blocks += taken + grow
        cache.settle(self.num_blocks - self.num_used_blocks)  # type: ignore[union-attr]
        return cpu.load(r.keys[hit.named:hit.named + hit.cpu], now_s)  # type: ignore[union-attr]

    def finish_load(self, r: SimRequest) -> int:
        """``r``'s load is done: the loaded blocks are cached on the GPU (held by ``r``) and free to leave
        the CPU tier. Returns the tokens ``r`` now has computed."""
        named, n = r.n_reg, r.n_reg + r.n_loading
        self.cpu.release(r.keys[named:n])  # type: ignore[union-attr]
        self.cache.register(r, n)  # type: ignore[union-attr]
        r.n_stored = max(r.n_stored, n)
        r.n_loading = 0
        return n * self.block_size

    def cancel_load(self, r: SimRequest) -> None:
        """``r`` leaves while its load runs: its blocks are freed (the link still carries the load)."""
        self.cpu.release(r.keys[r.n_reg:r.n_reg + r.n_loading])  # type: ignore[union-attr]
        r.n_loading = 0
        r.num_computed = 0
        self.free(r)

    # ------------------------------------------------------------------ decoding requests (the step clock)
    def start_decoding(self, key: int) -> None:
        """A request starts decoding with ``num_computed - clock == key``."""
        self.hist[key % self.block_size] += 1

    def free_decoding(self, r: SimRequest, key: int, preempted: bool = False) -> None:
        """A decoding request (its counters frozen at ``r.num_computed``, ``key`` its histogram key) finishes
        or is preempted: it leaves the histogram, its block count is frozen, and its blocks are freed."""
        self.hist[key % self.block_size] -= 1
        r.blocks = -(-r.num_computed // self.block_size)
        self.free(r, preempted)

    def max_decode_steps(self, clock: int, num_decode: int) -> int:
        """Largest ``k`` such that the block demand of the pure-decode steps 2..k after the step at ``clock``
        (whose blocks are allocated) fits in the free blocks."""
        free = self.num_blocks - self.num_used_blocks
        n = num_decode
        if n == 0:
            return 1 << 30
        bs = self.block_size
        full = free // n  # whole cycles of bs steps (each cycle needs one block per decoding request)
        k = 1 + full * bs
        free -= full * n  # < n: the next cycle does not fit
        # demand of step k+1 starts at clock c + k: hist[(c + k) mod bs], hist[(c + k + 1) mod bs]... counted
        # backwards; the steps that still fit are those whose running sum of demand stays within the free blocks
        h = self.hist
        p = (-(clock + k)) % bs + bs
        return k + bisect_right(list(accumulate((h + h)[p:p - bs:-1])), free)

    def allocate_decode_steps(self, clock: int, k: int, num_decode: int) -> None:
        """Allocate the block demand of steps 2..k of a pure-decode run whose first step was at ``clock``
        (``max_decode_steps`` said it fits)."""
        bs = self.block_size
        hist = self.hist
        full = (k - 1) // bs
        demand = full * num_decode if full else 0
        j = 1 + full * bs
        if k - j > 2:  # the rest of a cycle: a slice of the histogram, counted backwards
            p = (-(clock + j)) % bs + bs
            demand += sum((hist + hist)[p:p - (k - j):-1])
        else:
            for j in range(j, k):
                demand += hist[(-(clock + j)) % bs]
        self.num_used_blocks += demand

    # ------------------------------------------------------------------ checks (tests)
    def check(self, running: Iterable[SimRequest], clock: int, decode_growth: bool) -> None:
        """Invariants: counts in range; the blocks the running requests hold (a decoding request's from the
        clock), plus the decode demand already allocated for the step in progress (``decode_growth``), are
        the blocks in use plus those counted once though shared; the prefix cache's own invariants."""
        assert 0 <= self.num_used_blocks <= self.num_blocks, f"blocks out of range {self.num_used_blocks}"
        bs = self.block_size
        running = list(running)
        held = 0
        for r in running:
            held += -(-(r.key + clock) // bs) if r.decoding else r.blocks
        growth = self.hist[(-clock) % bs] if decode_growth else 0
        shared = self.cache.num_shared if self.cache is not None else 0
        assert held + growth == self.num_used_blocks + shared, (held, growth, self.num_used_blocks, shared)
        assert sum(self.hist) == sum(1 for r in running if r.decoding)
        if self.cache is not None:
            self.cache.check(running, self.num_blocks - self.num_used_blocks)

