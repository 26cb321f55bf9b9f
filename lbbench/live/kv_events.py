"""Live KV-cache events: a subscriber to each instance's ZMQ publisher, feeding ``precise_prefix``'s index.

vLLM publishes its prefix cache's changes when started with ``--kv-events-config`` (``vllm-project/vllm``
``vllm/distributed/kv_events.py`` @ ``b4e69e0af33f4698e157a262cc787fe61983cd3d``, ``vllm/config/kv_events.py`` @
``00634b8acf93e413a1c380288665a543b98be7ea``, Apache-2.0): a ZMQ PUB socket sends multipart messages
``[topic, seq, payload]``, ``seq`` an 8-byte big-endian counter, ``payload`` a msgpack ``EventBatch``
``[ts, events, data_parallel_rank]``. Each event is a tagged struct: a map ``{"type": "BlockStored", ...}`` (vLLM
0.32) or, in releases that encode events ``array_like``, a list ``["BlockStored", field, ...]`` in declaration
order. ``BlockStored`` names blocks by the engine's hashes (``block_hashes``, chained through
``parent_block_hash``) and carries their ``token_ids``; ``BlockRemoved`` names them by hash only;
``AllBlocksCleared`` drops everything. ``lbbench serve-sim --kv-events-port-base`` publishes the same.

The engine's hash depends on its ``--prefix-caching-hash-algo`` and a per-process seed, so the router does not
recompute it: each stored block is keyed here by its token content chain (``token_block_keys``: a block's key
folds its parent's key and its own token ids), the feed remembers engine hash -> key per instance (for parents and
removals, as Dynamo's indexer maps external hashes), and a request's keys are the same chain over the prompt's
token ids (``KVEventFeed.request_keys``). The translated events are the simulator's (``lbbench.sim.kv_events``)
and go to the same ``KVEventIndex`` through the same callback, stamped with the run clock at receipt: the
router's ``event_lag_s`` / ``event_loss`` then add lag and loss on top of the wire's.

A gap in ``seq`` (the PUB socket drops when a subscriber falls behind) is counted in ``num_missed``; the feed does
not ask the publisher's replay socket for the missed batches.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..core import Request
from ..errors import InputError
from ..sim.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

#: the root of every token chain (a block without parent)
ROOT_KEY = 0
#: the order of each event's fields in the array encoding (after the tag)
_FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                           "lora_name"),
           "BlockRemoved": ("block_hashes", "medium"),
           "AllBlocksCleared": ()}


class KVEventsError(InputError):
    """A KV-event address or message that cannot be used (the message says which)."""


#: the ZMQ transports a ``--kv-events`` address may name
ZMQ_SCHEMES = ("tcp://", "ipc://", "inproc://")


def address_problem(addresses: Sequence[str | None], num_endpoints: int | None = None) -> str | None:
    """What is wrong with ``--kv-events`` ``addresses`` given for ``num_endpoints`` endpoints (None: not checked),
    or None; each caller raises it as its own kind of error (a run's field, the proxy's flag, the feed)."""
    if num_endpoints is not None and addresses and len(addresses) != num_endpoints:
        return (f"{len(addresses)} address(es) for {num_endpoints} --endpoint(s): give one per endpoint, "
                "in order")
    bad = [a for a in addresses if a is not None and not a.startswith(ZMQ_SCHEMES)]
    return f"{bad[0]}: expected a ZMQ address such as tcp://HOST:PORT" if bad else None


def token_block_keys(token_ids: Sequence[int], block_size: int, parent_key: int = ROOT_KEY) -> list[int]:
    """Keys of the full ``block_size``-token blocks of ``token_ids``, each ``hash((key before, block's ids))``
    from ``parent_key`` (ints and tuples of ints hash the same in every Python process)."""
    keys = []
    key = parent_key
    for end in range(block_size, len(token_ids) + 1, block_size):
        key = hash((key, tuple(token_ids[end - block_size:end])))
        keys.append(key)
    return keys


def decode_batch(payload: bytes) -> tuple[float, list[dict[str, Any]], int | None]:
    """``(ts, events, data_parallel_rank)`` of one msgpack ``EventBatch``; each event a dict with its ``type``."""
    import msgspec  # lazy: the live extra

    try:
        batch = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise KVEventsError(f"KV event batch: not msgpack ({exc})") from None
    if isinstance(batch, dict):
        ts, raw, rank = batch.get("ts"), batch.get("events"), batch.get("data_parallel_rank")
    elif isinstance(batch, list) and len(batch) >= 2:
        ts, raw, rank = batch[0], batch[1], batch[2] if len(batch) > 2 else None
    else:
        raise KVEventsError(f"KV event batch: expected [ts, events, rank], got {type(batch).__name__}")
    if not isinstance(raw, list):
        raise KVEventsError("KV event batch: events is not a list")
    events = []
    for ev in raw:
        if isinstance(ev, list) and ev and ev[0] in _FIELDS:
            ev = {"type": ev[0], **dict(zip(_FIELDS[ev[0]], ev[1:]))}
        if not isinstance(ev, dict) or "type" not in ev:
            raise KVEventsError(f"KV event batch: an event without a type: {ev!r:.80}")
        events.append(ev)
    return float(ts), events, rank


@dataclass
class _Instance:
    """One publisher's state: its engine hashes' keys and its last sequence number."""

    key_of: dict[Any, int] = field(default_factory=dict)
    last_seq: int | None = None


class KVEventFeed:
    """Subscribes to one ZMQ publisher per instance (``addresses[i]``, None: that instance publishes nothing) and
    calls each subscriber's ``callback(instance, time_s, event)`` with the events translated to content keys.

    ``tokens_of(request)``: the prompt token ids the request is (or was) sent with, None when unknown (a text
    prompt); ``clock()``: the run clock the router's ``now_s`` reads. ``start()`` / ``close()`` inside the event
    loop; ``handle`` takes one message (the tests feed it directly)."""

    def __init__(self, addresses: Sequence[str | None], clock: Callable[[], float],
                 tokens_of: Callable[[Request], Sequence[int] | None], topic: str = ""):
        problem = address_problem(addresses)
        if problem:
            raise KVEventsError(problem, "kv_events")
        self.addresses = list(addresses)
        self.clock, self.tokens_of, self.topic = clock, tokens_of, topic
        self.instances = [_Instance() for _ in addresses]
        self.callbacks: list[Callable[[int, float, KVCacheEvent], None]] = []
        #: the engine's block size, from the first ``BlockStored`` (None: none seen yet)
        self.block_size: int | None = None
        self.num_batches = self.num_stored = self.num_removed = self.num_cleared = 0
        self.num_missed = 0  # batches lost on the wire (gaps in seq)
        self.num_unchained = 0  # stored blocks whose parent hash was never seen
        self.num_bad = 0  # messages that could not be read (skipped; the run goes on)
        self._ctx = None
        self._tasks: list[asyncio.Task] = []

    # -- the router's side ---------------------------------------------------------------------
    def subscribe(self, callback: Callable[[int, float, KVCacheEvent], None]) -> None:
        self.callbacks.append(callback)

    def request_keys(self, request: Request) -> list[int]:
        """The content keys of ``request``'s full prompt blocks at the engine's block size ([] before any event)."""
        if self.block_size is None:
            return []
        ids = self.tokens_of(request)
        return token_block_keys(ids, self.block_size) if ids else []

    def bind(self, router: Any) -> None:
        """Feed ``router`` (one with ``bind_kv_events``) from this feed."""
        router.bind_kv_events(self.subscribe, self.request_keys)

    # -- the wire ------------------------------------------------------------------------------
    def handle(self, instance: int, frames: Sequence[bytes]) -> None:
        """One multipart message ``[topic, seq, payload]`` (or ``[seq, payload]``) from ``instance``'s publisher."""
        if len(frames) < 2:
            raise KVEventsError(f"instance {instance}: KV event message with {len(frames)} frame(s)")
        seq = int.from_bytes(frames[-2], "big", signed=True)
        st = self.instances[instance]
        if st.last_seq is not None and seq > st.last_seq + 1:
            self.num_missed += seq - st.last_seq - 1
        st.last_seq = seq
        _, events, _ = decode_batch(frames[-1])
        self.num_batches += 1
        now_s = self.clock()
        for raw in events:
            ev = self.translate(instance, raw)
            if ev is not None:
                for cb in self.callbacks:
                    cb(instance, now_s, ev)

    def translate(self, instance: int, raw: dict[str, Any]) -> KVCacheEvent | None:
        """One decoded event of ``instance`` as the simulator's event over content keys (None: nothing to index)."""
        st = self.instances[instance]
        kind = raw["type"]
        medium = raw.get("medium") or MEDIUM_GPU
        if kind == "BlockStored":
            hashes, ids, size = list(raw["block_hashes"]), list(raw["token_ids"]), int(raw["block_size"])
            if len(ids) != len(hashes) * size:
                raise KVEventsError(f"instance {instance}: BlockStored with {len(hashes)} block(s) of {size} "
                                    f"tokens but {len(ids)} token ids")
            self.block_size = self.block_size or size
            parent = raw.get("parent_block_hash")
            root = ROOT_KEY
            lora = raw.get("lora_name") or raw.get("lora_id")
            if lora is not None:
                root = hash(("lora", lora))  # an adapter's blocks never match a base-model prompt
            parent_key = root if parent is None else st.key_of.get(parent)
            if parent_key is None:
                self.num_unchained += len(hashes)
                return None
            keys = token_block_keys(ids, size, parent_key)
            st.key_of.update(zip(hashes, keys))
            self.num_stored += len(keys)
            return BlockStored(tuple(keys), None if parent is None else parent_key, len(ids), size, medium)
        if kind == "BlockRemoved":
            keys = [k for k in (st.key_of.pop(h, None) for h in raw["block_hashes"]) if k is not None]
            self.num_removed += len(keys)
            return BlockRemoved(tuple(keys), medium) if keys else None
        if kind == "AllBlocksCleared":
            st.key_of.clear()
            self.num_cleared += 1
            return AllBlocksCleared()
        return None  # an event kind this version does not know

    # -- the loop --------------------------------------------------------------------------------
    def start(self) -> None:
        """Connect a SUB socket to every address and read them in this event loop."""
        import zmq  # lazy: the live extra
        import zmq.asyncio  # lazy: the live extra

        self._ctx = zmq.asyncio.Context()
        for i, addr in enumerate(self.addresses):
            if addr is None:
                continue
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(addr)
            self._tasks.append(asyncio.ensure_future(self._read(i, sock)))

    async def _read(self, instance: int, sock: Any) -> None:
        try:
            while True:
                frames = await sock.recv_multipart()
                try:
                    self.handle(instance, frames)
                except KVEventsError:
                    self.num_bad += 1  # a publisher that is not vLLM's format: counted, never a crashed reader
        finally:
            sock.close(0)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def summary(self) -> dict[str, int]:
        return {"batches": self.num_batches, "blocks_stored": self.num_stored, "blocks_removed": self.num_removed,
                "cleared": self.num_cleared, "batches_missed": self.num_missed, "blocks_unchained": self.num_unchained, "bad_messages": self.num_bad}
