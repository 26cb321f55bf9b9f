"""A router's index of the instances' prefix caches, built from their KV events (vLLM's ``BlockStored`` /
``BlockRemoved`` / ``AllBlocksCleared``; ``lbbench.sim.kv_events``), as a precise prefix router keeps one.

As NVIDIA Dynamo's KV indexer (``ai-dynamo/dynamo`` ``lib/llm/src/kv_router/indexer.rs`` @
``003dab3b6d82a228b39bce34988c05af5813717f``, Apache-2.0: a tree of block hashes per worker fed by the workers'
events; a stored chain whose parent block the index does not hold is skipped, a removal of an unknown block is
ignored) and llm-d's KV-cache manager (``llm-d/llm-d-kv-cache-manager`` ``pkg/kvcache/kvblock_scorer.go`` @
``760bfeab3c3ad3249798030bfa05ac1b6bb7b4ec``, Apache-2.0: ``LongestPrefix``, the count of consecutive blocks from
the prompt's first that an instance holds). GPU blocks only (a CPU tier's events are not indexed).

Events reach the index as a subscriber gets them, possibly late and possibly not at all: ``lag_s`` delays each
event (by its publication time) before it is applied, ``loss`` drops each event with that probability (seeded),
as a lossy publisher (vLLM's ZMQ PUB socket drops when a subscriber falls behind) would. ``catch_up(now_s)``
applies what has arrived by ``now_s``.

Speculative entries (llm-d's ``SpeculativeIndexing``, off by default there): ``speculate`` records that an
instance will hold a request's blocks as soon as the router sends it there, until a TTL runs out (llm-d's 30 s),
closing the blind spot between a decision and the events that confirm it.
"""

from __future__ import annotations

import heapq
import random

from ..prefix_blocks import leading_matches
from ..sim.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent


class KVEventIndex:
    """Per instance, the set of GPU block hashes its events say it caches."""

    def __init__(self, num_instances: int, lag_s: float = 0.0, loss: float = 0.0, seed: int = 0):
        if not lag_s >= 0:
            raise ValueError(f"event_lag_s must be >= 0, got {lag_s}")
        if not 0 <= loss < 1:
            raise ValueError(f"event_loss must be in [0, 1), got {loss}")
        self.lag_s, self.loss = float(lag_s), float(loss)
        self.blocks: list[set[int]] = [set() for _ in range(num_instances)]
        #: per instance: speculative block -> when it expires
        self.speculative: list[dict[int, float]] = [{} for _ in range(num_instances)]
        self._rng = random.Random(f"kv-events:{seed}")
        self._pending: list[tuple[float, int, int, KVCacheEvent]] = []  # (time, seq, instance, event)
        self._seq = 0
        self.num_events = self.num_lost = self.num_skipped = 0

    def __deepcopy__(self, memo: dict) -> "KVEventIndex":
        """A separate copy (block sets copied once each; events are immutable and shared): a planner copies the
        index into every rollout."""
        new = KVEventIndex.__new__(KVEventIndex)
        new.__dict__.update(self.__dict__)
        new.blocks = [set(b) for b in self.blocks]
        new.speculative = [dict(s) for s in self.speculative]
        new._rng = random.Random()
        new._rng.setstate(self._rng.getstate())
        new._pending = list(self._pending)
        return new

    def on_event(self, instance: int, time_s: float, event: KVCacheEvent) -> None:
        """A published event (``ClusterSim.subscribe_kv_events``'s callback)."""
        self.num_events += 1
        if self.loss and self._rng.random() < self.loss:
            self.num_lost += 1
            return
        self._seq += 1
        heapq.heappush(self._pending, (time_s + self.lag_s, self._seq, instance, event))

    def catch_up(self, now_s: float) -> None:
        """Apply every event that has arrived by ``now_s``, in arrival order."""
        pending = self._pending
        while pending and pending[0][0] <= now_s:
            _, _, i, ev = heapq.heappop(pending)
            self.apply(i, ev)

    def apply(self, instance: int, ev: KVCacheEvent) -> None:
        held = self.blocks[instance]
        if isinstance(ev, BlockStored):
            if ev.medium != MEDIUM_GPU:
                return
            if ev.parent_block_hash is not None and ev.parent_block_hash not in held:
                self.num_skipped += 1  # Dynamo's rule: a chain whose parent is unknown is skipped
                return
            held.update(ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            if ev.medium == MEDIUM_GPU:
                held.difference_update(ev.block_hashes)
        elif isinstance(ev, AllBlocksCleared):
            held.clear()

    def speculate(self, instance: int, keys: list[int], until_s: float) -> None:
        """``instance`` is taken to hold ``keys`` until ``until_s`` (or until events say so)."""
        spec = self.speculative[instance]
        for k in keys:
            spec[k] = until_s

    def longest_prefix(self, instance: int, keys: list[int], now_s: float | None = None) -> int:
        """Consecutive blocks of ``keys`` from the first that ``instance`` holds (llm-d's ``LongestPrefix``), its
        speculative blocks not yet expired at ``now_s`` included."""
        held = self.blocks[instance]
        spec = self.speculative[instance]
        if not spec or now_s is None:
            return leading_matches(keys, held)
        n = 0
        for k in keys:
            if k not in held and spec.get(k, -1.0) <= now_s:
                break
            n += 1
        if len(spec) > 4 * len(held) + 1024:  # drop the expired ones now and then
            self.speculative[instance] = {k: t for k, t in spec.items() if t > now_s}
        return n
