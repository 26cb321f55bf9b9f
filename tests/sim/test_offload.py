"""The CPU KV tier (vLLM's offloading connector): its LRU order, a hand-computed load (time, serialized
link, cached-token accounting), the profile fields, and hypothesis invariants with the tier on (every request
finishes once, counts add up, the tier never overflows, its events rebuild its contents)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbbench.errors import InputError
from lbbench.profiles import ProfileError, available_profiles, load_profile
from lbbench.sim.cluster import ClusterSim
from lbbench.sim.instance import SimInstance
from lbbench.sim.kv_events import MEDIUM_CPU, BlockRemoved, BlockStored, CachedBlocks
from lbbench.sim.offload import CpuTier
from lbbench.sim.prefix_cache import block_keys
from factories import tiny_profile
from test_prefix_cache import assert_each_finishes_once, build_shared, hreq
from test_properties import RR

MS_PER_BLOCK = dict(kv_bytes_per_block=1e6, cpu_link_bytes_s=1e9)  # 1 MB blocks over 1 GB/s: 1 ms a block


def test_the_tier_is_an_lru_whose_loads_pin_their_blocks():
    cpu = CpuTier(4, 4, 1e6, 1e9)
    seen = []
    cpu.emit = seen.append
    assert cpu.store([1, 2, 3, 4]) == 4
    cpu.touch([1, 2, 3, 4])  # a request's blocks, its first one most recent
    assert list(cpu.blocks) == [4, 3, 2, 1]
    assert cpu.store([1, 5]) == 1  # 1 is there already; 5 evicts the least recently used, 4
    assert list(cpu.blocks) == [3, 2, 1, 5]
    assert seen[-2:] == [BlockRemoved((4,), MEDIUM_CPU), BlockStored((5,), None, 4, 4, MEDIUM_CPU)]
    assert cpu.lookup([2, 1, 9, 5], 0, 4) == 2 and cpu.lookup([2, 1, 9, 5], 3, 4) == 1
    done = cpu.load([3, 2], now_s=1.0)
    assert done == pytest.approx(1.002) and cpu.link_free_s == done
    assert cpu.load([5], now_s=1.001) == pytest.approx(1.003)  # the link is busy until 1.002
    assert cpu.store([6, 7, 8]) is None and list(cpu.blocks) == [3, 2, 1, 5]  # only block 1 is unpinned
    assert cpu.store([6]) == 1 and list(cpu.blocks) == [3, 2, 5, 6]
    cpu.release([3, 2])
    assert cpu.store([7, 8]) == 2 and list(cpu.blocks) == [5, 6, 7, 8]


def _offload_profile(**kw):
    return tiny_profile(**{"block_size": 4, "max_num_batched_tokens": 64, "enable_prefix_caching": True,
                           "cpu_offload_blocks": 16, **MS_PER_BLOCK, **kw})


def test_a_request_loads_the_blocks_the_gpu_evicted():
    # 6 GPU blocks of 4 tokens. A (16 tokens, hashes 0..4) computes 4 blocks, stored to the CPU tier too.
    # C (20 tokens, no hashes) takes 5 blocks: the free space and A's blocks 3, 2, 1 go (its tail first).
    # B repeats A: block 0 is still on the GPU, blocks 1-2 load from the CPU (2 ms), 4 tokens are prefilled.
    prof = _offload_profile(num_kv_blocks=6, max_model_len=24)
    inst = SimInstance(prof, check_invariants=True)
    a, c, b = hreq(0, 0.0, 16, 1, range(5)), hreq(1, 1.0, 20, 1), hreq(2, 2.0, 16, 1, range(5))
    ev = []
    for r in (a, c, b):
        ev += inst.add(r, r.arrival_s)
        ev += inst.advance(r.arrival_s + 0.5)
    keys = block_keys(a, 4)
    assert set(inst.kv.cpu.blocks) == set(keys[:4])
    first = {e.request_id: e.time_s for e in ev if type(e).__name__ == "FirstToken"}
    load_s = 2 * 1e6 / 1e9
    assert first[2] == pytest.approx(2.0 + load_s + prof.base_s + prof.prefill_token_s * 4)
    assert inst.kv.cpu.loaded_blocks == 2 and inst.kv.cpu.num_loads == 1
    # B's blocks 1-2 are cached on the GPU again, held by nobody now
    assert {keys[0], keys[1], keys[2]} <= inst.kv.cached_hashes()
    assert inst.prefix_cache_hit_rate == pytest.approx(4 / (16 + 20 + 16))  # the GPU hit only


def test_loads_run_one_after_another_and_count_as_cached_tokens():
    prof = _offload_profile(num_kv_blocks=12, max_model_len=48)
    reqs = [hreq(0, 0.0, 16, 1, range(5)), hreq(1, 0.0, 16, 1, range(100, 105)),
            hreq(2, 1.0, 44, 1)]  # 11 blocks: evicts every cached block from the GPU
    reqs += [hreq(3, 2.0, 16, 1, range(5)), hreq(4, 2.0, 16, 1, range(100, 105))]
    sim = ClusterSim(prof, 1, reqs, check_invariants=True)
    recs = {r.request_id: r for r in sim.run(RR(1))}
    assert recs[3].cached_prompt_tokens == recs[4].cached_prompt_tokens == 12  # 3 blocks each, from the CPU
    # 3 then 3 blocks over one link: 3 ms, then 3 ms more; request 3 is prefilled at 2.003, request 4 once
    # its load is done (2.006) and request 3's step has ended
    t3 = 2.003 + prof.base_s + prof.prefill_token_s * 4
    assert recs[3].first_token_s == pytest.approx(t3)
    assert recs[4].first_token_s > 2.006 and recs[4].first_token_s > t3


def test_profile_fields_parse_and_default_off(tmp_path):
    text = available_profiles()["llama3.1-8b-a100-v0"].read_text()
    base = load_profile("llama3.1-8b-a100-v0")
    assert base.cpu_offload_blocks == 0 and base.kv_bytes_per_block == 0.0
    p = tmp_path / "offload.toml"
    p.write_text(text.replace("[kv]\n", "[kv]\nenable_prefix_caching = true\ncpu_offload_blocks = 4096\n"
                              "kv_bytes_per_block = 2097152\ncpu_link_bytes_s = 25e9\n"))
    prof = load_profile(p)
    assert (prof.cpu_offload_blocks, prof.kv_bytes_per_block, prof.cpu_link_bytes_s) == (4096, 2097152.0, 25e9)
    assert SimInstance(prof).kv.cpu.num_blocks == 4096
    p.write_text(text.replace("[kv]\n", "[kv]\ncpu_offload_blocks = 4096\n"))
    with pytest.raises(ProfileError, match="kv.kv_bytes_per_block must be a number > 0"):
        load_profile(p)
    with pytest.raises(InputError, match="prefix_caching"):
        ClusterSim(_offload_profile(), 1, [], prefix_caching=False)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(st.tuples(st.floats(0, 0.3), st.integers(1, 60), st.integers(1, 60), st.integers(0, 3),
                                st.integers(0, 12)), min_size=1, max_size=40),
       n_inst=st.integers(1, 2), chunked=st.booleans(), blocks=st.integers(35, 90), cpu_blocks=st.integers(1, 60),
       engine=st.sampled_from(["v1", "v0"]), sched=st.sampled_from(["fcfs", "bin_packing", "priority"]),
       g=st.sampled_from([4, 8]))
def test_invariants_with_the_cpu_tier(items, n_inst, chunked, blocks, cpu_blocks, engine, sched, g):
    prof = tiny_profile(num_kv_blocks=blocks, chunked_prefill=chunked, max_model_len=140, scheduler=engine,
                        enable_prefix_caching=True, cpu_offload_blocks=cpu_blocks, **MS_PER_BLOCK)
    reqs = build_shared(items, g)
    sim = ClusterSim(prof, n_inst, reqs, instance_scheduler=sched, check_invariants=True)
    views = [CachedBlocks() for _ in range(n_inst)]
    sim.subscribe_kv_events(lambda i, t, ev: views[i].apply(ev))
    assert_each_finishes_once(sim.run(RR(n_inst)), reqs)
    for inst, view in zip(sim.instances, views):
        cpu = inst.kv.cpu
        assert inst.used_blocks == 0 and not inst.loading and len(cpu.blocks) <= cpu_blocks
        assert all(n == 0 for n in cpu.blocks.values())  # every load released its blocks
        assert view.hashes(MEDIUM_CPU) == set(cpu.blocks)


def test_a_request_back_from_a_load_is_admitted_when_the_last_running_one_is_preempted():
    # H's load (2 blocks, 120 ms each) holds 3 of the 10 blocks while X decodes alone; X needs its 8th block
    # in the step where the load completes, none is free, X is preempted: H, back from its load, runs next
    prof = _offload_profile(num_kv_blocks=10, max_model_len=40, kv_bytes_per_block=1.2e8)
    reqs = [hreq(0, 0.0, 12, 1, range(4)), hreq(1, 0.5, 39, 1),  # A fills the tier; C evicts it from the GPU
            hreq(2, 1.0, 4, 30), hreq(3, 1.001, 12, 1, range(4))]  # X decodes; H loads A's blocks 0-1
    recs = {r.request_id: r for r in ClusterSim(prof, 1, reqs, check_invariants=True).run(RR(1))}
    assert recs[2].num_preemptions == 1 and recs[3].cached_prompt_tokens == 8
    assert recs[3].first_token_s > 1.001 + 0.24 and recs[3].finish_s < recs[2].finish_s


def test_a_chunked_prefill_after_a_load_uses_the_blocks_it_holds():
    # A's 8 blocks go to the tier; C evicts all but the first from the GPU; B shares A's 32 tokens, loads 7
    # blocks (7 ms) holding all 15 of its blocks, then prefills its other 28 tokens in chunks of 8, 8, 8, 4
    prof = _offload_profile(num_kv_blocks=20, max_model_len=80, chunked_prefill=True, max_num_batched_tokens=8)
    a = hreq(0, 0.0, 32, 1, list(range(8)) + [50 + j for j in range(10)])
    b = hreq(2, 2.0, 60, 1, list(range(8)) + [90 + j for j in range(10)])
    recs = {r.request_id: r for r in ClusterSim(prof, 1, [a, hreq(1, 1.0, 76, 1), b], check_invariants=True).run(RR(1))}
    assert recs[2].cached_prompt_tokens == 32
    assert recs[2].first_token_s == pytest.approx(2.0 + 0.007 + 4 * prof.base_s + prof.prefill_token_s * 28)
