"""KV cache events of a simulated instance, as vLLM publishes them for precise prefix routing.

vLLM's KV event publisher (vLLM-project/vllm, ``vllm/distributed/kv_events.py`` at
b4e69e0af33f4698e157a262cc787fe61983cd3d; emitted by ``vllm/v1/core/block_pool.py`` at
002f34915134cfd1a7d6ed777edd67dcc2289466, and for a CPU tier by the offloading connector,
``vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py`` at
7368908123b14495cca88daf580cbc07c384d5b3; Apache-2.0) tells a subscriber which blocks an engine holds:

- ``BlockStored``: full blocks became cached, named by their hashes in chain order; ``parent_block_hash`` is
  the hash of the block before the first of them (None at the start of a sequence, and for the CPU tier,
  whose events carry no chain); ``medium`` says where (``"GPU"``, ``"CPU"``). vLLM sends the blocks' token
  ids; the simulator has no token ids and sends their count (``num_tokens``, whole blocks);
- ``BlockRemoved``: cached blocks were evicted;
- ``AllBlocksCleared``: the engine's prefix cache was reset.

The simulator's block keys (``prefix_cache.block_keys``, a hash chain over the request's prefix hashes) are
the hashes. A block whose key is already cached is not cached a second time (vLLM caches such duplicates and
reports each); so replaying the events in order (``CachedBlocks``) gives exactly the set of keys the
instance's cache holds. Eviction in the simulator is lazy (``PrefixCache.settle``): a removal is reported when
the manager next settles, before anything reads the cache, so a subscriber may see it late but never out of
order. Subscribe with ``KVBlockManager.subscribe`` (one instance) or ``ClusterSim.subscribe_kv_events`` (every
instance, with its index and time); nothing is built while nobody subscribes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks became cached on ``medium``, in chain order."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    num_tokens: int
    block_size: int
    medium: str


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cached blocks were evicted from ``medium``."""

    block_hashes: tuple[int, ...]
    medium: str


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every cached block of the instance (all media) was dropped."""


KVCacheEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]
KVEventCallback = Callable[[KVCacheEvent], None]


class CachedBlocks:
    """A subscriber's view rebuilt from the events: the cached block hashes per medium."""

    def __init__(self) -> None:
        self.by_medium: dict[str, set[int]] = {}

    def apply(self, ev: KVCacheEvent) -> None:
        if isinstance(ev, BlockStored):
            held = self.by_medium.setdefault(ev.medium, set())
            assert not held.intersection(ev.block_hashes), "a block stored twice"
            held.update(ev.block_hashes)
        elif isinstance(ev, BlockRemoved):
            held = self.by_medium.setdefault(ev.medium, set())
            assert held.issuperset(ev.block_hashes), "a block removed that was not stored"
            held.difference_update(ev.block_hashes)
        else:
            self.by_medium.clear()

    def hashes(self, medium: str = MEDIUM_GPU) -> set[int]:
        return set(self.by_medium.get(medium, ()))
