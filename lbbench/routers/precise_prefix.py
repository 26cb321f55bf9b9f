"""``precise_prefix``: llm-d's precise prefix-cache scoring, fed by the instances' KV events.

Where ``prefix_load`` guesses an instance's cache from what the router sent there, ``precise_prefix`` reads it
from the events the engines publish (``KVEventIndex``: vLLM's ``--kv-events-config`` publisher live, the
simulator's block manager through ``ClusterSim.subscribe_kv_events``), as llm-d's ``precise-prefix-cache-scorer``
does (``llm-d/llm-d-inference-scheduler`` ``pkg/plugins/scorer/precise_prefix_cache.go`` @
``17abea8af978e6d8b49ac03834e0317884f07525`` with ``utils.go`` @ ``2202f3ca54371e64d835b2257a4bb802b2184ecb``,
Apache-2.0):

- the prompt's blocks are keyed at the engine's block size (the profile's; ``lbbench.prefix_blocks.block_keys``,
  the keys the simulated engine publishes), and each instance's score is its ``LongestPrefix`` match;
- scores are min-max normalised over the instances that hold the first block (all equal: 1), 0 for the others;
- the prefix scorer joins the queue and KV-cache scorers with ``prefix_load``'s weights, 3 / 2 / 2.

Options: ``event_lag_s`` (events reach the index that much later) and ``event_loss`` (each event lost with that
probability), ``block_size`` (default: the profile's), ``speculative`` (llm-d's speculative indexing, off by default
there and here: the chosen instance is taken to hold the prompt's blocks at once, for ``speculative_ttl_s``, 30 s).
The backend feeds it through ``bind_kv_events``: the simulator with its block manager's events (keys:
``block_keys``), a live run or the proxy with ``lbbench.live.kv_events.KVEventFeed`` (the engines' ZMQ
publishers, given as ``--kv-events``; keys: the prompt's token-content chain, ``request_keys``). Without a feed a
live run or the proxy refuses it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..core import InstanceView, Request
from ..prefix_blocks import block_keys
from ..profiles import Profile
from .cache_aware import PrefixLoad
from .kv_index import KVEventIndex
from .registry import register


@register("precise_prefix", "llm-d's precise prefix-cache scorer on the instances' KV events (lag, loss) + queue "
                            "+ KV headroom, 3/2/2")
class PrecisePrefix(PrefixLoad):
    #: the backend must feed it the instances' KV events (``bind_kv_events``)
    needs_kv_events = True

    def __init__(self, num_instances: int, seed: int = 0, profile: Profile | None = None,
                 event_lag_s: float = 0.0, event_loss: float = 0.0, block_size: int | None = None,
                 speculative: bool = False, speculative_ttl_s: float = 30.0, **kw: Any):
        super().__init__(num_instances, seed, profile, **kw)
        self.block_size = int(block_size or (profile.block_size if profile is not None else 16))
        self.index = KVEventIndex(num_instances, float(event_lag_s), float(event_loss), seed)
        self.bound = False
        self.speculative, self.speculative_ttl_s = bool(speculative), float(speculative_ttl_s)
        self._request_keys: Callable[[Request], list[int]] | None = None  # None: ``block_keys``

    def bind_kv_events(self, subscribe: Callable[[Callable[..., None]], None],
                       request_keys: Callable[[Request], list[int]] | None = None) -> None:
        """``subscribe(callback)`` registers ``callback(instance, time_s, event)`` for every KV event;
        ``request_keys(request)``: a request's block keys as the events name blocks (None: ``block_keys`` at
        ``block_size``, the simulator's)."""
        subscribe(self.index.on_event)
        self._request_keys = request_keys
        self.bound = True

    def request_keys(self, r: Request) -> list[int]:
        return block_keys(r, self.block_size) if self._request_keys is None else self._request_keys(r)

    def prefix_scores(self, r: Request, healthy: Sequence[InstanceView], now_s: float) -> list[float]:
        self.index.catch_up(now_s)
        keys = self.request_keys(r)
        matched = [self.index.longest_prefix(iv.index, keys, now_s) for iv in healthy]
        hits = [m for m in matched if m > 0]
        if not hits:
            return [0.0] * len(healthy)
        lo, hi = min(hits), max(hits)
        return [0.0 if m == 0 else 1.0 if hi == lo else (m - lo) / (hi - lo) for m in matched]

    def placed(self, request: Request, instance: int, now_s: float) -> None:
        """The cache is read from the events; with ``speculative``, the chosen instance is also taken to hold the
        prompt's blocks from now until the TTL runs out."""
        self._last = instance
        if self.speculative:
            self.index.speculate(instance, self.request_keys(request), now_s + self.speculative_ttl_s)
