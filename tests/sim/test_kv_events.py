"""KV cache events (vLLM's BlockStored / BlockRemoved / AllBlocksCleared): a hand-built prefix case gives
exactly the expected events, replaying the events rebuilds the cache's set of blocks (hypothesis),
subscribing changes no record, and a clone publishes nothing to the original's subscribers."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbbench.sim.cluster import ClusterSim
from lbbench.sim.instance import SimInstance
from lbbench.sim.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, CachedBlocks
from lbbench.sim.prefix_cache import block_keys
from factories import tiny_profile
from test_prefix_cache import build_shared, hreq, items_st
from test_properties import RR


def test_two_requests_sharing_a_prefix_give_the_expected_events():
    # 5 blocks of 4 tokens. A (16 prompt tokens, hashes 0..4) caches 4 blocks; C (no hashes, 2 blocks)
    # evicts the free space and A's last block; B shares A's first 3 blocks and caches its own 4th.
    prof = tiny_profile(block_size=4, num_kv_blocks=5, max_model_len=20, max_num_batched_tokens=64)
    a = hreq(0, 0.0, 16, 1, range(5))
    c = hreq(1, 1.0, 8, 1)
    b = hreq(2, 2.0, 16, 1, [0, 1, 2, 9, 9])
    ka, kb = block_keys(a, 4), block_keys(b, 4)
    assert ka[:3] == kb[:3] and ka[3] != kb[3]
    inst = SimInstance(prof, check_invariants=True, prefix_caching=True)
    seen = []
    inst.kv.subscribe(seen.append)
    for r in (a, c, b):
        inst.add(r, r.arrival_s)
        inst.advance(r.arrival_s + 0.5)
    assert seen == [BlockStored(tuple(ka[:4]), None, 16, 4, MEDIUM_GPU),
                    BlockRemoved((ka[3],), MEDIUM_GPU),
                    BlockStored((kb[3],), ka[2], 4, 4, MEDIUM_GPU)]
    assert inst.kv.cached_hashes() == set(ka[:3]) | {kb[3]}
    # reset: refused while blocks are in use, then every block goes, published as one event
    assert inst.kv.reset_prefix_cache()
    assert seen[-1] == AllBlocksCleared() and inst.kv.cached_hashes() == set()
    inst.add(hreq(3, 3.0, 16, 4, range(5)), 3.0)
    assert not inst.kv.reset_prefix_cache() and seen[-1] != AllBlocksCleared()


def test_nobody_subscribed_builds_nothing_and_subscribing_changes_no_record():
    prof = tiny_profile(num_kv_blocks=60, max_model_len=140)
    reqs = build_shared([(0.05, 30 + i % 7, 20 + i % 5, i % 4, 6) for i in range(30)], 4)
    plain = ClusterSim(prof, 2, reqs, prefix_caching=True)
    assert all(inst.kv.cache.emit is None for inst in plain.instances)
    watched = ClusterSim(prof, 2, reqs, prefix_caching=True)
    events = []
    watched.subscribe_kv_events(lambda i, t, ev: events.append((i, t, ev)))
    assert plain.run(RR(2)) == watched.run(RR(2))
    assert events and {i for i, _, _ in events} == {0, 1}
    assert all(t1 <= t2 for (i1, t1, _), (i2, t2, _) in zip(events, events[1:]) if i1 == i2)


def test_a_clone_publishes_nothing_to_the_originals_subscribers():
    prof = tiny_profile(num_kv_blocks=60, max_model_len=140)
    reqs = build_shared([(0.05, 30, 20, 1 + i % 3, 6) for i in range(20)], 4)
    sim = ClusterSim(prof, 2, reqs, prefix_caching=True)
    events = []
    sim.subscribe_kv_events(lambda i, t, ev: events.append(ev))
    sim.set_router(RR(2))
    sim.run_until(0.3)
    n = len(events)
    fork = sim.clone()
    fork.run_until(math.inf)
    assert fork.done and len(events) == n
    sim.run_until(math.inf)
    assert len(events) > n


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=items_st, n_inst=st.integers(1, 3), chunked=st.booleans(), blocks=st.integers(35, 120),
       engine=st.sampled_from(["v1", "v0"]), g=st.sampled_from([4, 8]), step=st.floats(0.05, 0.5))
def test_replaying_the_events_rebuilds_the_cached_blocks(items, n_inst, chunked, blocks, engine, g, step):
    prof = tiny_profile(num_kv_blocks=blocks, chunked_prefill=chunked, max_model_len=140, scheduler=engine)
    sim = ClusterSim(prof, n_inst, build_shared(items, g), check_invariants=True, prefix_caching=True)
    views = [CachedBlocks() for _ in range(n_inst)]
    sim.subscribe_kv_events(lambda i, t, ev: views[i].apply(ev))
    sim.set_router(RR(n_inst))
    k = 0
    while not sim.done:
        k += 1
        sim.run_until(k * step)
        for inst, view in zip(sim.instances, views):
            cached = inst.kv.cached_hashes()  # makes the evictions due first, and publishes them
            assert view.hashes(MEDIUM_GPU) == cached
