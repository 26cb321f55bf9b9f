"""serve-sim's KV-event publisher: an emulated instance's prefix-cache changes over ZMQ, in vLLM's wire format.

An emulated instance (``emulator.EmulatedInstance``) caches prompt blocks by content as vLLM does:
``content_request`` names each full ``block_size``-token block of a token-id prompt by a hash of its ids
(``prefix_hashes`` at ``prefix_block_tokens = block_size``), so the simulated block manager's chained keys
(``lbbench.prefix_blocks``) match exactly when two prompts share every token up to a block's end.

``KVEventPublisher`` subscribes to that block manager and publishes its events as vLLM's ``ZmqEventPublisher``
does (``vllm-project/vllm`` ``vllm/distributed/kv_events.py`` @ ``b4e69e0af33f4698e157a262cc787fe61983cd3d``,
Apache-2.0): a PUB socket bound at the address, one multipart message ``[topic, seq (8 bytes, big-endian),
payload]`` per engine advance, ``payload`` the msgpack batch ``[ts, events, 0]`` with each event a map tagged by
``type`` (vLLM 0.32's encoding): ``BlockStored`` (``block_hashes`` as unsigned 64-bit ints, as vLLM sends them
with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``; ``parent_block_hash``; the blocks' ``token_ids``; ``block_size``;
``lora_id`` None; ``medium``), ``BlockRemoved``, ``AllBlocksCleared``. No replay socket.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any, Sequence

from ...core import Request
from ...prefix_blocks import block_keys
from ...sim.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

_U64 = (1 << 64) - 1
#: token ids of blocks kept for the store events still to come (the oldest are dropped past this)
MAX_REMEMBERED_BLOCKS = 1 << 18


def content_request(request_id: int, arrival_s: float, token_ids: Sequence[int], output_tokens: int,
                    block_size: int) -> Request:
    """A request whose prefix hashes name its prompt's full blocks by content (so equal prefixes share keys)."""
    hashes = tuple(hash(tuple(token_ids[s:s + block_size]))
                   for s in range(0, len(token_ids) - block_size + 1, block_size))
    return Request(request_id, arrival_s, len(token_ids), output_tokens, prefix_hashes=hashes or None,
                   prefix_block_tokens=block_size)


def prompt_token_ids(body: dict) -> list[int] | None:
    """The token ids of a completion body's prompt (None: a text prompt)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        return prompt
    return None


class KVEventPublisher:
    """Publishes one emulated instance's KV events at ``address`` (``tcp://HOST:PORT``, bound)."""

    def __init__(self, address: str, block_size: int, topic: str = ""):
        import msgspec  # lazy: the live extra
        import zmq  # lazy: the live extra

        self.address, self.block_size = address, block_size
        self._topic = topic.encode()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(address)
        except zmq.ZMQError as exc:
            self.close()
            raise OSError(f"kv events: cannot bind {address}: {exc}") from None
        self._noblock = zmq.NOBLOCK
        self._again = zmq.Again
        self._encode = msgspec.msgpack.Encoder().encode
        self._tokens: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # block key -> its token ids
        self._pending: list[dict[str, Any]] = []
        self._seq = 0
        self.num_sent = self.num_dropped = 0

    def remember(self, request: Request, token_ids: Sequence[int]) -> None:
        """Keep the token ids of ``request``'s full prompt blocks for their store events."""
        b = self.block_size
        for k, key in enumerate(block_keys(request, b)):
            self._tokens[key] = tuple(token_ids[k * b:(k + 1) * b])
            self._tokens.move_to_end(key)
        while len(self._tokens) > MAX_REMEMBERED_BLOCKS:
            self._tokens.popitem(last=False)

    def on_event(self, ev: KVCacheEvent) -> None:
        """The block manager's callback: queue ``ev``; the batch goes out once the engine's advance is over."""
        if isinstance(ev, BlockStored):
            ids: list[int] = []
            for key in ev.block_hashes:
                ids.extend(self._tokens.get(key, ()))
            if len(ids) != len(ev.block_hashes) * self.block_size:
                return  # blocks whose tokens this instance never saw (cannot happen with token-id prompts)
            parent = ev.parent_block_hash
            wire = {"type": "BlockStored", "block_hashes": [k & _U64 for k in ev.block_hashes],
                    "parent_block_hash": None if parent is None else parent & _U64, "token_ids": ids,
                    "block_size": self.block_size, "lora_id": None, "medium": ev.medium}
        elif isinstance(ev, BlockRemoved):
            wire = {"type": "BlockRemoved", "block_hashes": [k & _U64 for k in ev.block_hashes], "medium": ev.medium}
        elif isinstance(ev, AllBlocksCleared):
            wire = {"type": "AllBlocksCleared"}
        else:
            return
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append(wire)

    def flush(self) -> None:
        """Send the queued events as one batch (dropped, as a full PUB queue drops, when it cannot go now)."""
        if not self._pending:
            return
        payload = self._encode([time.time(), self._pending, 0])
        self._pending = []
        try:
            self._sock.send_multipart([self._topic, self._seq.to_bytes(8, "big"), payload], self._noblock)
            self.num_sent += 1
        except self._again:
            self.num_dropped += 1
        self._seq += 1

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()
