"""A CPU tier for an instance's KV blocks, as vLLM's offloading connector keeps one.

vLLM's ``OffloadingConnector`` (vLLM-project/vllm,
``vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py`` at
7368908123b14495cca88daf580cbc07c384d5b3, with ``vllm/v1/kv_offload/lru_manager.py`` at
3a04cf8f14c971435137c3ec572a7803c663673d; Apache-2.0) stores every full, hashed block a request computes
into a CPU LRU of ``num_cpu_blocks`` blocks, and lets a new request whose GPU prefix hit stops short load
the next blocks from it. What the simulator keeps of it:

- **store**: each request's full keyed blocks, in order, as they are computed (``store``): blocks already in
  the tier are skipped, room is made by evicting least recently used blocks that no load is reading, and when
  there is not enough such room nothing is stored (the request tries again with its next blocks); after a
  store, the request's blocks are touched, its first block ending most recent. A store costs no time: it
  runs device-to-host beside the steps, and vLLM's ``complete_store`` makes the block readable a step or so
  later, which the simulator does not model (a block is reloaded long after it was evicted from the GPU);
- **lookup**: the blocks that follow a request's GPU hit and are in the tier, counted from the first, up to
  the last block before the request's last token (the GPU hit's cap: at least one token is computed); every
  lookup touches the request's blocks;
- **load**: the request holds GPU blocks for the loaded blocks at once and becomes schedulable when the load
  completes (vLLM's ``WAITING_FOR_REMOTE_KVS``); loads run one after another on the host-to-device link, each
  taking ``blocks * bytes_per_block / link_bytes_s`` seconds (``load``). The loaded tokens count as cached
  prompt tokens of the request.

The tier publishes KV events with medium ``"CPU"`` and no parent hash, as the connector does.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from .kv_events import MEDIUM_CPU, BlockRemoved, BlockStored, KVEventCallback


class CpuTier:
    """An LRU of KV blocks in host memory, and the link that loads them back (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, bytes_per_block: float, link_bytes_s: float):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self.link_bytes_s = link_bytes_s
        #: key -> number of loads reading it, least recently used first
        self.blocks: OrderedDict[int, int] = OrderedDict()
        self.link_free_s = 0.0  # when the link finishes the loads queued on it
        self.num_stored = 0
        self.num_evicted = 0
        self.num_loads = 0
        self.loaded_blocks = 0
        self.emit: KVEventCallback | None = None

    def fork(self) -> "CpuTier":
        """An independent copy; it publishes no events."""
        new = CpuTier.__new__(CpuTier)
        new.__dict__.update(self.__dict__)
        new.blocks = OrderedDict(self.blocks)
        new.emit = None
        return new

    def touch(self, keys: Sequence[int]) -> None:
        """Mark ``keys`` recently used, the first of them most recently."""
        blocks = self.blocks
        for key in reversed(keys):
            if key in blocks:
                blocks.move_to_end(key)

    def lookup(self, keys: Sequence[int], start: int, stop: int) -> int:
        """How many of ``keys[start:stop]`` are in the tier, counted from the first."""
        blocks = self.blocks
        n = 0
        for i in range(start, stop):
            if keys[i] not in blocks:
                break
            n += 1
        return n

    def store(self, keys: Sequence[int]) -> int | None:
        """Store the blocks of ``keys`` not yet in the tier; returns how many were stored, or None (nothing
        stored) when not enough unread blocks can be evicted to make room."""
        blocks = self.blocks
        new = [k for k in keys if k not in blocks]
        excess = len(new) - (self.num_blocks - len(blocks))
        evict: list[int] = []
        if excess > 0:
            for key, readers in blocks.items():
                if not readers:
                    evict.append(key)
                    if len(evict) == excess:
                        break
            else:
                return None
        for key in evict:
            del blocks[key]
        for key in new:
            blocks[key] = 0
        self.num_evicted += len(evict)
        self.num_stored += len(new)
        if self.emit is not None:
            if evict:
                self.emit(BlockRemoved(tuple(evict), MEDIUM_CPU))
            if new:
                bs = self.block_size
                self.emit(BlockStored(tuple(new), None, len(new) * bs, bs, MEDIUM_CPU))
        return len(new)

    def load(self, keys: Sequence[int], now_s: float) -> float:
        """Start loading ``keys`` (all in the tier) at ``now_s`` or when the link is free; returns when the
        load completes. The blocks cannot be evicted until ``release(keys)``."""
        blocks = self.blocks
        for key in keys:
            blocks[key] += 1
        start_s = max(now_s, self.link_free_s)
        self.link_free_s = done_s = start_s + len(keys) * self.bytes_per_block / self.link_bytes_s
        self.num_loads += 1
        self.loaded_blocks += len(keys)
        return done_s

    def release(self, keys: Sequence[int]) -> None:
        """A load of ``keys`` is over (done or abandoned)."""
        blocks = self.blocks
        for key in keys:
            blocks[key] -= 1

    def clear(self) -> None:
        """Drop every block no load is reading (a prefix-cache reset)."""
        for key in [k for k, readers in self.blocks.items() if not readers]:
            del self.blocks[key]
