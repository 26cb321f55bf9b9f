"""Heuristic routers: valid instances always, the policy each name promises."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.core import ClusterState, Dispatched, FirstToken, InstanceHealth, InstanceSpec, StepsAdvanced
from lbbench.routers import available_routers, get_router
from lbbench.routers.registry import UnknownRouterError
from factories import req, tiny_profile

HEURISTICS = ["round_robin", "random", "jsq", "min_min", "mcu", "decode_balancer", "dedicated_small_large",
              "least_requests", "power_of_two"]


def test_registry_lists_paper_routers():
    names = available_routers()
    for n in HEURISTICS:
        assert n in names and names[n]
    with pytest.raises(UnknownRouterError, match="^router"):
        get_router("nope", num_instances=2)


@settings(max_examples=50, deadline=None)
@given(name=st.sampled_from(HEURISTICS), n=st.integers(1, 5),
       load=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 500), st.integers(1, 900)), max_size=20),
       down=st.sets(st.integers(0, 4)))
def test_routers_return_a_valid_healthy_instance(name, n, load, down):
    state = ClusterState([InstanceSpec(kv_capacity_tokens=5000)] * n)
    for k, (i, p, o) in enumerate(load):
        state.apply(Dispatched(req(k, 0.0, p, o), i % n, 0.0))
    down = {d for d in down if d < n}
    for d in down:
        state.apply(InstanceHealth(d, 0.0, False))
    r = get_router(name, num_instances=n, seed=1, profile=tiny_profile())
    d = r.route([req(99, 0.0, 10, 10)], state.view(), 0.0)
    if len(down) == n:
        assert d is None
    else:
        assert d is not None and d.queue_index == 0 and 0 <= d.instance < n and d.instance not in down


def _state_with(loads):
    state = ClusterState([InstanceSpec()] * len(loads))
    k = 0
    for i, reqs in enumerate(loads):
        for p, o in reqs:
            state.apply(Dispatched(req(k, 0.0, p, o), i, 0.0))
            k += 1
    return state


def test_round_robin_cycles():
    r = get_router("round_robin", num_instances=3)
    v = _state_with([[], [], []]).view()
    assert [r.route([req(0, 0, 1, 1)], v, 0).instance for _ in range(4)] == [0, 1, 2, 0]


def test_jsq_picks_fewest_tokens_left_not_fewest_requests():
    # instance 0: one huge request; instance 1: three small ones
    v = _state_with([[(10, 2000)], [(10, 10)] * 3]).view()
    assert get_router("jsq", num_instances=2).route([req(9, 0, 5, 5)], v, 0).instance == 1
    assert get_router("least_requests", num_instances=2).route([req(9, 0, 5, 5)], v, 0).instance == 0


def test_decode_balancer_counts_progress():
    state = _state_with([[(10, 100)], [(10, 60)]])
    # instance 0's request has generated 80 tokens: 20 left, less than instance 1's 60
    state.apply(StepsAdvanced(0, 0.1, 1))
    state.apply(FirstToken(0, 0, 0.1))
    state.apply(StepsAdvanced(0, 0.2, 79))
    assert get_router("decode_balancer", num_instances=2).route([req(9, 0, 5, 5)], state.view(), 0).instance == 0


def test_dedicated_small_large_separates_heavy_decodes():
    prof = tiny_profile(min_step_s=0.02)
    r = get_router("dedicated_small_large", num_instances=2, profile=prof)
    v = _state_with([[], []]).view()
    assert r.route([req(0, 0, 10, 300)], v, 0).instance == 1  # 300 x 0.02 s = 6 s: heavy
    assert r.route([req(1, 0, 10, 50)], v, 0).instance == 0


def test_min_min_takes_the_shortest_queued_job():
    r = get_router("min_min", num_instances=2, profile=tiny_profile())
    v = _state_with([[(10, 500)], []]).view()
    d = r.route([req(0, 0, 10, 400), req(1, 0, 10, 20)], v, 0)
    assert d.queue_index == 1 and d.instance == 1


def test_seeded_random_routers_are_deterministic():
    v = _state_with([[], [], [], []]).view()
    for name in ("random", "power_of_two"):
        r1, r2 = get_router(name, num_instances=4, seed=3), get_router(name, num_instances=4, seed=3)
        s1 = [r1.route([req(0, 0, 1, 1)], v, 0).instance for _ in range(20)]
        s2 = [r2.route([req(0, 0, 1, 1)], v, 0).instance for _ in range(20)]
        assert s1 == s2
        assert len(set(s1)) > 1  # it does spread load
        r1.reset()
        assert [r1.route([req(0, 0, 1, 1)], v, 0).instance for _ in range(20)] == s1  # reset restarts the stream
