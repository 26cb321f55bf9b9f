"""Prefix caching in the simulated instance: hand-computed reuse and LRU eviction, and
hypothesis properties (every request finishes once, no block both held and free or
evicted, the hit rate never above the shared share, no sharing = no change)."""

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbbench.core import Request
from lbbench.sim.cluster import ClusterSim
from lbbench.sim.instance import SimInstance
from lbbench.sim.prefix_cache import block_keys
from factories import tiny_profile
from test_properties import RR


def hreq(i, t, prompt, output, hashes=None, g=4):
    return Request(i, t, prompt, output, prefix_hashes=tuple(hashes) if hashes else None, prefix_block_tokens=g)


def run_one(prof, reqs, caching=True):
    sim = ClusterSim(prof, 1, reqs, check_invariants=True, prefix_caching=caching)
    recs = {r.request_id: r for r in sim.run(RR(1))}
    return sim, recs


def test_block_keys_follow_the_hash_chain():
    a = hreq(0, 0, 40, 1, [7, 8, 9], g=16)  # 3 hashes of 16 tokens name 40 prompt tokens (48 > 41)
    b = hreq(1, 0, 40, 1, [7, 8, 5], g=16)
    c = hreq(2, 0, 40, 1, [6, 8, 9], g=16)
    ka, kb, kc = (block_keys(r, 8) for r in (a, b, c))
    assert len(ka) == 5  # 41 tokens named (prompt + output) -> 5 full 8-token blocks
    assert ka[:4] == kb[:4] and ka[4] != kb[4]  # blocks up to token 32 share hashes 7, 8
    assert not set(ka) & set(kc)  # a different first hash changes every later block
    assert block_keys(hreq(3, 0, 40, 1), 8) == []


def test_hit_skips_the_cached_prefill_tokens():
    prof = tiny_profile(block_size=4, num_kv_blocks=64, max_num_batched_tokens=128)
    a = hreq(0, 0.0, 40, 2, range(10))
    b = hreq(1, 5.0, 40, 2, list(range(8)) + [99, 98])  # shares 32 tokens = 8 blocks
    sim, recs = run_one(prof, [a, b])
    assert recs[0].cached_prompt_tokens == 0 and recs[1].cached_prompt_tokens == 32
    # an idle instance: TTFT = base + a * prefilled tokens
    assert abs((recs[1].first_token_s - 5.0) - (0.01 + 1e-4 * 8)) < 1e-12
    assert abs(recs[0].first_token_s - (0.01 + 1e-4 * 40)) < 1e-12
    assert sim.instances[0].prefix_cache_hit_rate == 32 / 80
    # identical prompt: all but the last block is reused (one token is always computed)
    c = hreq(2, 9.0, 40, 2, range(10))
    _, recs = run_one(prof, [a, c])
    assert recs[2].cached_prompt_tokens == 36


def _lru_run(touch_a_again, check):
    """4 KV blocks of 4 tokens; A and B (8 tokens, 2 blocks each) finish, maybe A comes back,
    then C (no hashes) takes 2 blocks and evicts the two least recently used cached ones;
    last, one request with A's or B's first block (it can reuse 1 block) shows what is left."""
    prof = tiny_profile(block_size=4, num_kv_blocks=4, max_model_len=16)
    reqs = [hreq(0, 0.0, 8, 1, [1, 2, 3]), hreq(1, 1.0, 8, 1, [4, 5, 6])]
    t = 2.0
    if touch_a_again:
        reqs.append(hreq(2, t, 8, 1, [1, 2, 3]))
        t += 1
    reqs.append(hreq(3, t, 8, 1))
    reqs.append(hreq(4, t + 1, 8, 1, [1, 7, 7] if check == "A" else [4, 8, 8]))
    return run_one(prof, reqs)[1]


def test_free_blocks_are_evicted_least_recently_used_first():
    assert _lru_run(False, "A")[4].cached_prompt_tokens == 0  # A's blocks were the oldest free ones
    assert _lru_run(False, "B")[4].cached_prompt_tokens == 4  # B's survived C
    recs = _lru_run(True, "A")
    assert recs[2].cached_prompt_tokens == 4  # 8 tokens: the last block is always recomputed
    assert recs[4].cached_prompt_tokens == 4  # A was used again, so B's blocks went first
    assert _lru_run(True, "B")[4].cached_prompt_tokens == 0


def test_a_preempted_request_reuses_its_own_blocks():
    prof = tiny_profile(block_size=4, num_kv_blocks=30, max_model_len=120, max_num_batched_tokens=128)
    reqs = [hreq(i, 0.001 * i, 20, 60) for i in range(4)]  # no sharing; decodes outgrow the KV cache
    sim_on, on = run_one(prof, reqs, caching=True)
    sim_off, off = run_one(prof, reqs, caching=False)
    assert sum(r.num_preemptions for r in off.values()) > 0
    assert sim_on.instances[0].kv.cache.preempted_hit_tokens > 0
    assert all(r.cached_prompt_tokens == 0 for r in on.values())  # no hit at first admission
    assert max(r.finish_s for r in on.values()) < max(r.finish_s for r in off.values())


def test_shared_blocks_count_once():
    prof = tiny_profile(block_size=4, num_kv_blocks=64, max_num_batched_tokens=128)
    inst = SimInstance(prof, check_invariants=True, prefix_caching=True)
    inst.add(hreq(0, 0.0, 40, 50, range(10)), 0.0)
    inst.advance(0.05)
    inst.add(hreq(1, 0.05, 40, 50, range(10)), 0.05)
    inst.advance(0.2)
    assert inst.num_running == 2
    # 9 of B's 10 prompt blocks are A's: 11 + 11 blocks referenced, 9 of them twice
    held = sum(-(-(r.key + inst.clock) // 4) for r in inst.running)
    assert inst.kv.cache.num_shared == 9
    growth = inst.kv.hist[(-inst.clock) % 4]  # blocks allocated for the step in progress
    assert inst.used_blocks == held + growth - 9


# ---------------------------------------------------------------------------------- properties

items_st = st.lists(st.tuples(st.floats(0, 0.3), st.integers(1, 60), st.integers(1, 60), st.integers(0, 3),
                              st.integers(0, 12)), min_size=1, max_size=35)


def build_shared(items, g):
    """Requests whose prompts start with one of 4 shared prefixes (or none) of a given length."""
    out, t = [], 0.0
    for i, (gap, p, o, which, shared_blocks) in enumerate(items):
        t += gap
        n = -(-(p + o) // g)
        hashes = [1000 * which + j for j in range(min(shared_blocks, n))]
        hashes += [10**6 * (i + 1) + j for j in range(n - len(hashes))]  # the rest is the request's own
        out.append(hreq(i, t, p, o, hashes if which else None, g))
    return out


def assert_each_finishes_once(recs, reqs) -> None:
    """Every request has one record, complete, in time order, with fewer cached tokens than its prompt."""
    assert sorted(r.request_id for r in recs) == [r.request_id for r in reqs]
    for r in recs:
        assert r.error is None and r.generated_tokens == r.output_tokens
        assert r.arrival_s <= r.dispatch_s <= r.first_token_s <= r.finish_s
        assert 0 <= r.cached_prompt_tokens < r.prompt_tokens


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=items_st, n_inst=st.integers(1, 3), chunked=st.booleans(), blocks=st.integers(35, 120),
       sched=st.sampled_from(["fcfs", "bin_packing", "priority"]), engine=st.sampled_from(["v1", "v0"]),
       g=st.sampled_from([4, 8, 6]))
def test_cache_invariants_and_hit_bound(items, n_inst, chunked, blocks, sched, engine, g):
    prof = tiny_profile(num_kv_blocks=blocks, chunked_prefill=chunked, max_model_len=140, scheduler=engine)
    reqs = build_shared(items, g)
    # check_invariants runs PrefixCache.check every step: a held block is never in the free
    # queue, an evicted one is never held, the counts add up
    sim = ClusterSim(prof, n_inst, reqs, instance_scheduler=sched, check_invariants=True, prefix_caching=True)
    recs = sim.run(RR(n_inst))
    assert_each_finishes_once(recs, reqs)
    for inst in sim.instances:
        assert inst.used_blocks == 0 and inst.kv.cache.num_shared == 0
        assert all(n == 0 for n in inst.kv.cache.ref.values())
    # each block's first computation is a miss: hits <= block_size * sum(occurrences - 1)
    occ = Counter(k for r in reqs for k in set(block_keys(r, prof.block_size)))
    bound = prof.block_size * sum(n - 1 for n in occ.values())
    hits = sum(r.cached_prompt_tokens for r in recs)
    assert hits <= bound
    total = sum(r.prompt_tokens for r in reqs)
    assert hits / total <= bound / total


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=items_st, chunked=st.booleans(), engine=st.sampled_from(["v1", "v0"]), unique=st.booleans())
def test_no_sharing_gives_the_same_timings_as_caching_off(items, chunked, engine, unique):
    # a KV cache large enough that nothing is preempted (a preempted request would reuse its own blocks)
    prof = tiny_profile(num_kv_blocks=2000, chunked_prefill=chunked, max_model_len=140, scheduler=engine,
                        max_num_seqs=64)
    reqs = [replace(r, prefix_hashes=(tuple(10**6 * (r.request_id + 1) + j for j in range(40)) if unique
                                      else None), prefix_block_tokens=4)
            for r in build_shared(items, 4)]
    on = ClusterSim(prof, 2, reqs, check_invariants=True, prefix_caching=True).run(RR(2))
    off = ClusterSim(prof, 2, reqs, prefix_caching=False).run(RR(2))
    key = lambda r: r.request_id  # noqa: E731
    for a, b in zip(sorted(on, key=key), sorted(off, key=key)):
        assert (a.first_token_s, a.finish_s, a.tbt_mean_s) == (b.first_token_s, b.finish_s, b.tbt_mean_s)
        assert a.cached_prompt_tokens == 0 and b.cached_prompt_tokens is None


def test_profile_key_turns_caching_on(tmp_path):
    from lbbench.profiles import ProfileError, available_profiles, load_profile
    text = available_profiles()["llama3.1-8b-a100-v0"].read_text()
    assert not load_profile("llama3.1-8b-a100-v0").enable_prefix_caching
    p = tmp_path / "apc.toml"
    p.write_text(text.replace("[kv]\n", "[kv]\nenable_prefix_caching = true\n"))
    prof = load_profile(p)
    assert prof.enable_prefix_caching and SimInstance(prof).kv.cache is not None
    p.write_text(text.replace("[kv]\n", "[kv]\nenable_prefix_caching = \"yes\"\n"))
    try:
        load_profile(p)
    except ProfileError as exc:
        assert "kv.enable_prefix_caching" in str(exc)
    else:
        raise AssertionError("a non-boolean enable_prefix_caching was accepted")
