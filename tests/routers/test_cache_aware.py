"""Cache-aware routers: the router-side prefix trees, the policy each name promises, and
end to end in the simulator with prefix caching on."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.core import ClusterState, Dispatched, FirstToken, InstanceHealth, InstanceSpec, Request
from lbbench.routers import available_routers, get_router
from lbbench.routers.prefix_tree import PrefixTrees, prompt_chains
from factories import run_sessions, tiny_profile

NEW = ["cache_aware", "prefix_load", "session_affinity", "cache_length_aware"]


def hreq(i, prompt=64, out=8, hashes=(1, 2, 3, 4), g=16, session=None, turn=None):
    return Request(i, 0.0, prompt, out, prefix_hashes=tuple(hashes) if hashes else None, prefix_block_tokens=g,
                   session_id=session, turn=turn)


def state_with(n, loads=(), cap=100_000):
    state = ClusterState([InstanceSpec(kv_capacity_tokens=cap)] * n)
    k = 1000
    for i, count in enumerate(loads):
        for _ in range(count):
            state.apply(Dispatched(hreq(k, hashes=None), i, 0.0))
            k += 1
    return state


def test_chains_cover_the_prompt_only():
    r = hreq(0, prompt=40, hashes=(1, 2, 3, 4, 5))  # a session turn also names its answer
    chains, g = prompt_chains(r)
    assert g == 16 and len(chains) == 3  # ceil(40 / 16)
    assert prompt_chains(hreq(1, prompt=40, hashes=(9, 2, 3)))[0][1] != chains[1]  # a chain, not a hash


def test_trees_match_longest_prefix_and_evict_leaves_first():
    t = PrefixTrees(2, max_tokens=64)
    t.insert(0, hreq(0, prompt=64, hashes=(1, 2, 3, 4)))
    assert t.match_tokens(0, hreq(1, prompt=64, hashes=(1, 2, 9, 9))) == 32
    assert t.match_tokens(1, hreq(1, prompt=64, hashes=(1, 2, 9, 9))) == 0
    assert t.match_tokens(0, hreq(2, prompt=20, hashes=(1, 2, 3, 4))) == 20  # capped at the prompt
    t.insert(0, hreq(3, prompt=32, hashes=(7, 8)))  # 96 tokens > 64: the oldest leaves (3, 4) go
    assert t.tokens[0] == 64
    assert t.match_tokens(0, hreq(4, prompt=64, hashes=(1, 2, 3, 4))) == 32
    assert t.match_tokens(0, hreq(5, prompt=32, hashes=(7, 8))) == 32


def test_cache_aware_follows_its_threshold_and_balance_guard():
    r = get_router("cache_aware", num_instances=3, profile=tiny_profile())
    view = state_with(3).view()
    assert r.route([hreq(0)], view, 0.0).instance == 0  # nothing matches: smallest tree (ties in turn)
    assert r.route([hreq(1, hashes=(5, 6, 7, 8))], view, 0.0).instance == 1
    assert r.route([hreq(2, hashes=(1, 2, 3, 9))], view, 0.0).instance == 0  # 48 of 64 tokens > 0.5
    assert r.route([hreq(3, hashes=(1, 9, 9, 9))], view, 0.0).instance == 2  # 16 of 64 < 0.5: smallest tree
    # imbalanced (40 - 0 > 32 and 40 > 1.0001 * 0): the least loaded, whatever matches
    assert r.route([hreq(4)], state_with(3, (40, 3, 0)).view(), 0.0).instance == 2
    # balanced by the absolute threshold: affinity wins
    assert r.route([hreq(5)], state_with(3, (30, 3, 0)).view(), 0.0).instance == 0


def test_prefix_load_scores():
    r = get_router("prefix_load", num_instances=2, profile=tiny_profile())
    st0 = state_with(2)
    assert r.route([hreq(0)], st0.view(), 0.0).instance == 0
    # instance 0: prefix 1.0 (x3), queue 0 of (0..2) -> 0 (x2); instance 1: prefix 0, queue 1 (x2): 3 > 2
    assert r.route([hreq(1)], state_with(2, (2, 0)).view(), 0.0).instance == 0
    # with 4 x the queue weight, the queue wins
    r2 = get_router("prefix_load", num_instances=2, profile=tiny_profile(), queue_weight=8.0)
    r2.route([hreq(0)], st0.view(), 0.0)
    assert r2.route([hreq(1)], state_with(2, (2, 0)).view(), 0.0).instance == 1


def test_session_affinity_keeps_a_session_together():
    r = get_router("session_affinity", num_instances=3, profile=tiny_profile())
    assert r.route([hreq(0, session=7, turn=0)], state_with(3, (2, 0, 1)).view(), 0.0).instance == 1
    assert r.route([hreq(1, session=7, turn=1)], state_with(3, (0, 9, 1)).view(), 0.0).instance == 1
    assert r.route([hreq(2, session=8, turn=0)], state_with(3, (0, 9, 1)).view(), 0.0).instance == 0
    st = state_with(3, (0, 9, 1))
    st.apply(InstanceHealth(1, 0.0, False))
    assert r.route([hreq(3, session=7, turn=2)], st.view(), 0.0).instance == 0  # its home is down


def test_cache_length_aware_weighs_the_hit_against_queued_prefill():
    prof = tiny_profile(prefill_token_s=1e-3, num_kv_blocks=1000)  # its trees hold 4,000 tokens
    r = get_router("cache_length_aware", num_instances=2, profile=prof)
    st = state_with(2)
    big = [hreq(i, prompt=640, hashes=range(40)) for i in range(4)]
    first = r.route([big[0]], st.view(), 0.0).instance
    st.apply(Dispatched(big[0], first, 0.0))
    assert r.prefill.tokens[first] == 640
    # while its 640 tokens are queued there, the same prompt is as fast elsewhere (no queue, no hit)
    # and the tie goes to the other instance
    other = r.route([big[1]], st.view(), 0.0).instance
    assert other != first and r.prefill.tokens[other] == 640
    st.apply(Dispatched(big[1], other, 0.0))
    for rid, inst in ((0, first), (1, other)):
        st.apply(FirstToken(rid, inst, 0.1))
        r.on_event(FirstToken(rid, inst, 0.1))
    assert r.prefill.tokens == [0, 0]
    # now the whole prompt is expected cached at both (but its last token): 1 uncached token queues
    third = r.route([big[2]], st.view(), 0.0).instance
    assert r.prefill.tokens[third] == 1
    st.apply(Dispatched(big[2], third, 0.0))
    # a prompt sharing nothing goes where less prefill is queued
    assert r.route([hreq(9, prompt=32, hashes=(99, 98))], st.view(), 0.0).instance != third


@pytest.mark.parametrize("rule", ["current", "footprint"])
def test_cache_length_aware_avoids_a_full_instance(rule):
    r = get_router("cache_length_aware", num_instances=2, profile=tiny_profile(), kv_slack=0.1, headroom_rule=rule)
    st = ClusterState([InstanceSpec(kv_capacity_tokens=1000)] * 2)
    st.apply(Dispatched(hreq(50, prompt=800, out=50, hashes=None), 1, 0.0))
    if rule == "current":
        st.apply(FirstToken(50, 1, 0.1))  # decoding: its 800 tokens of KV are in use now
    r.trees.insert(1, hreq(51, prompt=64))  # instance 1 would have the prefix, but no room
    assert r.route([hreq(52, prompt=64, out=64)], st.view(), 0.0).instance == 0
    # with room everywhere the prefix wins
    roomy = ClusterState([InstanceSpec(kv_capacity_tokens=100_000)] * 2)
    assert r.route([hreq(53, prompt=64, out=64)], roomy.view(), 0.0).instance == 1


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(NEW), n=st.integers(1, 4), down=st.sets(st.integers(0, 3)),
       loads=st.lists(st.integers(0, 40), min_size=4, max_size=4))
def test_routers_return_a_valid_healthy_instance(name, n, down, loads):
    st = state_with(n, loads[:n])
    down = {d for d in down if d < n}
    for d in down:
        st.apply(InstanceHealth(d, 0.0, False))
    d = get_router(name, num_instances=n, profile=tiny_profile()).route([hreq(0, session=1, turn=0)], st.view(), 0)
    if len(down) == n:
        assert d is None
    else:
        assert d is not None and d.instance not in down and 0 <= d.instance < n


@pytest.mark.parametrize("name", NEW)
def test_end_to_end_in_the_simulator(name):
    _, reqs, recs = run_sessions(name)
    assert sorted(r.request_id for r in recs) == list(range(len(reqs)))
    assert name in available_routers()
    assert sum(r.cached_prompt_tokens for r in recs) > 0
