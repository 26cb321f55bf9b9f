"""The KV block manager apart from the scheduler: hand-computed allocations, failures that change nothing,
the decode histogram's demand, and hypothesis invariants over random sequences of admissions, prefill
chunks and frees (blocks never negative nor above capacity, counts add up, everything returns)."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbbench.core import Request
from lbbench.sim.block_manager import KVBlockManager
from lbbench.sim.request import SimRequest


def sreq(i: int, prompt: int, output: int = 1, hashes=None, g: int = 4) -> SimRequest:
    return SimRequest(Request(i, 0.0, prompt, output, prefix_hashes=tuple(hashes) if hashes else None,
                              prefix_block_tokens=g))


def test_allocate_slots_counts_blocks_and_fails_without_change():
    kv = KVBlockManager(10, 4)
    a = sreq(0, 13)
    assert kv.allocate_slots(a, 13) == 4  # ceil(13 / 4)
    a.num_computed = 13
    assert kv.allocate_slots(a, 3) == 0  # 16 tokens still fit in 4 blocks
    a.num_computed = 16
    assert kv.allocate_slots(a, 1) == 1
    a.num_computed = 17
    b = sreq(1, 24)
    assert kv.allocate_slots(b, 24) is None  # 6 blocks, 5 free: refused, nothing changed
    assert (kv.num_used_blocks, b.blocks) == (5, 0)
    assert kv.allocate_slots(b, 20, reserve_blocks=1) is None  # 5 fit, but one block stays free
    assert kv.allocate_slots(b, 16, reserve_blocks=1) == 4 and kv.num_free_blocks == 1
    kv.free(a)
    assert (kv.num_used_blocks, a.blocks, kv.usage) == (4, 0, 0.4)


def test_decode_blocks_and_the_histogram():
    kv = KVBlockManager(8, 4)
    assert kv.allocate_decode_block() and kv.num_used_blocks == 1
    kv.num_used_blocks = 8
    assert not kv.allocate_decode_block() and kv.num_used_blocks == 8
    kv.num_used_blocks = 0
    # three decoders at clock 0 with num_computed 4, 5, 8: keys 4, 5, 8 -> residues 0, 1, 0
    for key in (4, 5, 8):
        kv.start_decoding(key)
    assert kv.hist == [2, 1, 0, 0]
    # the step at clock c needs hist[(-c) % 4]: 2 blocks at clock 0, then 0, 0, 1 at clocks 1..3
    assert [kv.hist[(-c) % 4] for c in range(4)] == [2, 0, 0, 1]
    kv.num_used_blocks = 2  # step 1's two blocks are allocated
    # steps 2, 3, ... (clocks 1, 2, ...) need 0, 0, 1, 2, 0, 0, 1, 2, 0, 0, 1: 6 free blocks last to step 11
    assert kv.max_decode_steps(0, 3) == 11
    kv.allocate_decode_steps(0, 11, 3)
    assert kv.num_used_blocks == 2 + (0 + 0 + 1 + 2 + 0 + 0 + 1 + 2 + 0 + 0)
    r = sreq(0, 4)
    r.num_computed = 13  # the decoder of key 4 stops at 13 computed tokens: it held 4 blocks
    kv.free_decoding(r, 4)
    assert r.blocks == 0 and kv.num_used_blocks == 8 - 4 and kv.hist == [1, 1, 0, 0]


def test_a_cached_prefix_is_found_and_held():
    kv = KVBlockManager(20, 4, prefix_caching=True)
    a, b = sreq(0, 16, 1, range(5)), sreq(1, 16, 1, list(range(3)) + [9, 9])
    for r in (a, b):
        kv.add_request(r)
    assert kv.lookup(a).blocks == 0
    kv.allocate_slots(a, 16, kv.lookup(a))
    a.num_computed = 16
    hit = kv.lookup(b)
    assert (hit.blocks, hit.from_free) == (3, 0)  # a holds them: shared, not taken from the free queue
    assert kv.allocate_slots(b, 4, hit) == 1  # 12 cached tokens + 4 new = 4 blocks, 3 of them shared
    assert kv.num_used_blocks == 5 and kv.cache.num_shared == 3
    kv.free(a)
    assert kv.num_used_blocks == 4  # a's last block went to the free queue, still cached
    c = sreq(2, 20, 1, range(6))  # a's 4 cached blocks are within its reach (19 tokens): 3 shared with b, 1 free
    kv.add_request(c)
    assert (kv.lookup(c).blocks, kv.lookup(c).from_free) == (4, 1)


# ---------------------------------------------------------------------------------- properties

ops = st.lists(st.tuples(st.sampled_from(["admit", "grow", "free", "preempt"]), st.integers(0, 7),
                         st.integers(1, 40)), min_size=1, max_size=60)


def _snapshot(kv: KVBlockManager):
    cache = kv.cache
    return (kv.num_used_blocks, copy.deepcopy(cache.ref), [list(e) for e in cache.queue.values()],
            cache.num_queued, cache.num_shared)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, blocks=st.integers(4, 40), prefixes=st.integers(1, 3))
def test_random_admissions_chunks_and_frees_keep_the_counts(ops, blocks, prefixes):
    bs = 4
    kv = KVBlockManager(blocks, bs, prefix_caching=True)
    reqs = {}
    for i in range(8):  # prompts of 10..52 tokens over one of a few shared prefixes
        prompt = 10 + 6 * i
        hashes = [100 * (i % prefixes) + j for j in range(3)] + [1000 * (i + 1) + j for j in range(20)]
        reqs[i] = r = sreq(i, prompt, 4, hashes)
        kv.add_request(r)
    running: set[int] = set()
    for op, i, n in ops:
        r = reqs[i]
        if op == "admit" and i not in running and r.num_computed == 0:
            hit = kv.lookup(r)
            computed = hit.blocks * bs if hit is not None else 0
            assert computed <= r.num_tokens - 1  # one token is always computed
            need = min(n, r.num_tokens - computed)
            before = _snapshot(kv)
            if kv.allocate_slots(r, need, hit) is None:
                assert _snapshot(kv) == before  # a refusal changes nothing
                continue
            r.num_computed = computed + need
            running.add(i)
        elif op == "grow" and i in running and r.num_computed < r.num_tokens:
            need = min(n, r.num_tokens - r.num_computed)
            before = _snapshot(kv)
            if kv.allocate_slots(r, need) is None:
                assert _snapshot(kv) == before
                continue
            r.num_computed += need
        elif op in ("free", "preempt") and i in running:
            kv.free(r, preempted=op == "preempt")
            running.discard(i)
            r.num_computed = 0
        else:
            continue
        assert 0 <= kv.num_used_blocks <= blocks
        assert all(reqs[j].blocks >= 0 for j in reqs)
        kv.check([reqs[j] for j in running], 0, decode_growth=False)
    for i in list(running):
        kv.free(reqs[i])
    assert kv.num_used_blocks == 0 and kv.cache.num_shared == 0
    assert all(n == 0 for n in kv.cache.ref.values())
