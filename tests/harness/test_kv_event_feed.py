"""Live KV events without a server: vLLM's wire format decoded from hand-built msgpack batches (both encodings),
engine hashes mapped to token-content keys that match a prompt's (hand-computed), a routing decision from events,
removals, clears, unchained blocks and sequence gaps, the router's lag and loss on top, and serve-sim's publisher
read back over a real ZMQ socket."""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from lbbench.core import ClusterState, InstanceSpec, Request
from lbbench.engines.vllm.emulator import free_port
from lbbench.engines.vllm.kv_publisher import KVEventPublisher, content_request
from lbbench.live.kv_events import KVEventFeed, KVEventsError, decode_batch, token_block_keys
from lbbench.routers import get_router
from lbbench.sim.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored


def frames(seq: int, events: list, ts: float = 1.5) -> list[bytes]:
    """A message as vLLM's ZmqEventPublisher sends it: [topic, 8-byte big-endian seq, msgpack [ts, events, rank]]."""
    return [b"kv-events", seq.to_bytes(8, "big"), msgpack.packb([ts, events, 0])]


def stored(hashes, parent, token_ids, block_size=2):
    # vLLM 0.32's encoding: a map tagged by "type", fields by name (omit_defaults drops the trailing ones)
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": token_ids,
            "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None}


def test_decode_both_encodings_of_a_batch():
    ts, events, rank = decode_batch(msgpack.packb([2.5, [stored([7], None, [1, 2]),
                                                         {"type": "AllBlocksCleared"}], 3]))
    assert (ts, rank) == (2.5, 3)
    assert events[0]["block_hashes"] == [7] and events[0]["token_ids"] == [1, 2] and events[1]["type"] == \
        "AllBlocksCleared"
    # older vLLM encodes events array_like: [tag, block_hashes, parent, token_ids, block_size, lora_id, medium]
    _, events, rank = decode_batch(msgpack.packb([2.5, [["BlockStored", [b"\x01"], None, [1, 2], 2, None, "GPU"],
                                                        ["BlockRemoved", [b"\x01"], "GPU"]]]))
    assert rank is None
    assert events[0] == {"type": "BlockStored", "block_hashes": [b"\x01"], "parent_block_hash": None,
                         "token_ids": [1, 2], "block_size": 2, "lora_id": None, "medium": "GPU"}
    assert events[1] == {"type": "BlockRemoved", "block_hashes": [b"\x01"], "medium": "GPU"}
    with pytest.raises(KVEventsError, match="not msgpack"):
        decode_batch(b"\xc1")
    with pytest.raises(KVEventsError, match="without a type"):
        decode_batch(msgpack.packb([1.0, [{"block_hashes": []}]]))


def test_token_keys_by_hand():
    k1 = hash((0, (1, 2)))
    k2 = hash((k1, (3, 4)))
    assert token_block_keys([1, 2, 3, 4, 5], 2) == [k1, k2]  # the partial tail is not a block
    assert token_block_keys([3, 4], 2, parent_key=k1) == [k2]


def test_feed_translates_engine_hashes_to_the_prompts_keys_and_routes_by_them():
    clock = [0.0]
    prompt = {0: [1, 2, 3, 4, 5, 6, 7]}
    feed = KVEventFeed(["tcp://a:1", "tcp://b:1", None], lambda: clock[0], lambda r: prompt.get(r.request_id))
    router = get_router("precise_prefix", num_instances=3, seed=0, block_size=16)  # the events' block size wins
    feed.bind(router)
    r = Request(0, 0.0, 7, 4)
    assert feed.request_keys(r) == []  # no event yet: the engine's block size is unknown
    k1, k2 = hash((0, (1, 2))), hash((hash((0, (1, 2))), (3, 4)))
    k3 = hash((k2, (5, 6)))
    # instance 1 stores blocks 1-2 (sha256-style byte hashes), then block 3 chained to its parent's hash
    feed.handle(1, frames(0, [stored([b"h1", b"h2"], None, [1, 2, 3, 4])]))
    feed.handle(1, frames(1, [stored([b"h3"], b"h2", [5, 6])]))
    # instance 0 stores block 1 only (int hashes, as VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES sends them)
    feed.handle(0, frames(0, [stored([11], None, [1, 2])]))
    assert feed.request_keys(r) == [k1, k2, k3]
    router.index.catch_up(0.0)  # events wait in the index until the router's clock reaches them (plus its lag)
    assert router.index.blocks[1] == {k1, k2, k3} and router.index.blocks[0] == {k1}
    view = ClusterState([InstanceSpec(kv_capacity_tokens=1000)] * 3).view()
    # longest prefixes 1, 3, 0 -> normalised over 1..3: 0, 1, 0; queue and KV scorers tie -> instance 1
    assert router.prefix_scores(r, view.instances, 0.0) == [0.0, 1.0, 0.0]
    assert router.route([r], view, 0.0) == (0, 1)
    # instance 1 evicts its first block (by engine hash): its prefix match is 0 now -> 1, 0, 0 -> instance 0
    feed.handle(1, frames(2, [{"type": "BlockRemoved", "block_hashes": [b"h1"], "medium": "GPU"}]))
    assert router.prefix_scores(r, view.instances, 0.0) == [1.0, 0.0, 0.0]
    assert router.route([r], view, 0.0) == (0, 0)
    # a gap in seq (batches 3, 4 lost) and a chain whose parent was never seen: counted, not indexed
    feed.handle(1, frames(5, [stored([b"h9"], b"unknown", [8, 9])]))
    assert (feed.num_missed, feed.num_unchained) == (2, 1)
    feed.handle(0, frames(1, [{"type": "AllBlocksCleared"}]))
    router.index.catch_up(0.0)
    assert router.index.blocks[0] == set() and feed.instances[0].key_of == {}
    assert feed.summary()["blocks_stored"] == 4
    with pytest.raises(KVEventsError, match="2 block.*3 token ids"):
        feed.handle(0, frames(2, [stored([1, 2], None, [1, 2, 3])]))
    with pytest.raises(KVEventsError, match="expected a ZMQ address"):
        KVEventFeed(["http://a:1"], lambda: 0.0, lambda r: None)


def test_lag_and_loss_apply_to_live_events_as_in_the_simulator():
    clock = [10.0]
    feed = KVEventFeed(["tcp://a:1", "tcp://b:1"], lambda: clock[0], lambda r: [1, 2, 3, 4])
    router = get_router("precise_prefix", num_instances=2, seed=0, event_lag_s=1.0)
    feed.bind(router)
    feed.handle(1, frames(0, [stored([5, 6], None, [1, 2, 3, 4])]))  # received at 10.0
    r = Request(0, 0.0, 4, 4)
    view = ClusterState([InstanceSpec(kv_capacity_tokens=1000)] * 2).view()
    assert router.prefix_scores(r, view.instances, 10.9) == [0.0, 0.0]  # still in flight
    assert router.prefix_scores(r, view.instances, 11.0) == [0.0, 1.0]
    lossy = get_router("precise_prefix", num_instances=2, seed=0, event_loss=0.5)
    feed2 = KVEventFeed(["tcp://a:1"], lambda: 0.0, lambda r: None)
    feed2.bind(lossy)
    feed2.handle(0, frames(0, [stored([i], None, [i, i]) for i in range(400)]))
    assert lossy.index.num_events == 400 and 140 < lossy.index.num_lost < 260
    lossy.index.catch_up(0.0)
    assert len(lossy.index.blocks[0]) == 400 - lossy.index.num_lost


def test_serve_sim_publisher_speaks_vllms_wire_format():
    import zmq

    port = free_port()
    ids = list(range(100, 105))
    req = content_request(0, 0.0, ids, 4, block_size=2)  # blocks (100, 101), (102, 103); 104 is a partial tail
    assert req.prefix_hashes == (hash((100, 101)), hash((102, 103))) and req.prefix_block_tokens == 2

    async def publish() -> list[bytes]:
        pub = KVEventPublisher(f"tcp://127.0.0.1:{port}", block_size=2, topic="kv")
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{port}")
        try:
            from lbbench.prefix_blocks import block_keys
            keys = block_keys(req, 2)
            pub.remember(req, ids)
            for _ in range(50):  # PUB drops what it sends before the subscription has joined: send until one lands
                pub.on_event(BlockStored(tuple(keys), None, 4, 2, MEDIUM_GPU))
                pub.on_event(BlockRemoved((keys[1],), MEDIUM_GPU))
                pub.on_event(AllBlocksCleared())
                await asyncio.sleep(0.02)
                if sub.poll(0):
                    return sub.recv_multipart()
            raise AssertionError("no KV event batch arrived")
        finally:
            sub.close(0)
            ctx.term()
            pub.close()

    topic, seq, payload = asyncio.run(publish())
    assert topic == b"kv" and len(seq) == 8
    _, events, rank = decode_batch(payload)
    assert rank == 0 and [e["type"] for e in events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    st = events[0]
    assert st["token_ids"] == [100, 101, 102, 103] and st["block_size"] == 2 and st["parent_block_hash"] is None
    assert all(0 <= h < 1 << 64 for h in st["block_hashes"]) and events[1]["block_hashes"] == st["block_hashes"][1:]
    # a subscriber keys them as the prompt's token chain
    feed = KVEventFeed(["tcp://x:1"], lambda: 0.0, lambda r: ids)
    feed.handle(0, [topic, seq, payload])
    assert feed.request_keys(Request(0, 0.0, 5, 1)) == token_block_keys(ids, 2)
