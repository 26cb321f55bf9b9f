"""The prefill/decode pair routers' decisions, computed by hand on small views (``lbbench.routers.pd``)."""

from __future__ import annotations

import pytest

from lbbench.core import (ClusterState, Dispatched, Failed, Finished, FirstToken, InstanceSpec, PairDecision, Request,
                          prefill_leg)
from lbbench.routers import get_router
from lbbench.routers.registry import is_pair_router

ROLES = ("prefill", "prefill", "decode", "decode")


def _state(loads=()):
    """Instances 0-1 prefill, 2-3 decode (default specs: 5,000 prompt tokens/s, 20 ms steps, 50 tokens/s of
    decode); ``loads``: (instance, prompt tokens) of requests already there, without a first token."""
    state = ClusterState([InstanceSpec(role=r) for r in ROLES])
    for k, (inst, prompt) in enumerate(loads):
        state.apply(Dispatched(Request(1000 + k, 0.0, prompt, 10), inst, 0.0))
    return state


def _req(i, prompt, output=10, hashes=None, g=16):
    return Request(i, 0.0, prompt, output, prefix_hashes=hashes, prefix_block_tokens=g)


def _route(router, request, state):
    return router.route([request], state.view(detail=False), 0.0)


def test_every_pd_router_is_a_pair_router_and_no_other_is():
    for name in ("pd_llmd", "pd_llmd_always", "pd_dynamo", "pd_vllm", "pd_joint"):
        assert is_pair_router(name)
    assert not is_pair_router("round_robin") and not is_pair_router("kv_overlap")


def test_llmd_picks_decode_first_then_decides_by_uncached_tokens():
    router = get_router("pd_llmd", num_instances=4)
    # decode 2 holds a request: queue scores 0 (2) and 1 (3); prefill 0 holds two: 1 is picked
    state = _state([(2, 50), (0, 50), (0, 60)])
    assert _route(router, _req(1, 100), state) == PairDecision(0, 3, 1)
    assert _route(router, _req(2, 5), state) == PairDecision(0, 3, None)  # shorter than 8 tokens: whole


def test_llmd_serves_whole_where_the_decode_pod_has_the_prefix():
    router = get_router("pd_llmd", num_instances=4)
    state = _state()
    # nothing known: every score ties (prefix 0, queue 1), the lowest index wins; 64 uncached tokens >= 8
    assert _route(router, _req(1, 64, hashes=(1, 2, 3, 4)), state) == PairDecision(0, 2, 0)
    # the same 64 tokens and 6 more: decode 2 scores 64/70 + 1 against 1; 6 uncached tokens < 8: whole there
    assert _route(router, _req(2, 70, hashes=(1, 2, 3, 4, 5)), state) == PairDecision(0, 2, None)
    always = get_router("pd_llmd_always", num_instances=4)
    always.route([_req(1, 64, hashes=(1, 2, 3, 4))], state.view(), 0.0)
    assert _route(always, _req(2, 70, hashes=(1, 2, 3, 4, 5)), state) == PairDecision(0, 2, 0)


def test_llmd_threshold_zero_always_disaggregates():
    router = get_router("pd_llmd", num_instances=4, non_cached_tokens=0)
    assert _route(router, _req(1, 2), _state()) == PairDecision(0, 2, 0)


def test_vllm_router_round_robins_each_group():
    router = get_router("pd_vllm", num_instances=4)
    state = _state()
    got = [_route(router, _req(i, 100), state) for i in range(3)]
    assert got == [PairDecision(0, 2, 0), PairDecision(0, 3, 1), PairDecision(0, 2, 0)]


def test_dynamo_prefills_by_kv_cost_then_decodes_by_active_blocks():
    router = get_router("pd_dynamo", num_instances=4)  # 16-token blocks without a profile
    state = _state()
    # 64 tokens: prefill cost 64/16 + 4 new blocks = 8 on both, decode cost 4 on both: the lowest indices
    assert _route(router, _req(1, 64), state) == PairDecision(0, 2, 0)
    # 32 tokens: prefill 0 = (64 + 32)/16 + 4 + 2 = 12, prefill 1 = 2 + 2 = 4; decode 2 = 4 + 2, decode 3 = 2
    assert _route(router, _req(2, 32), state) == PairDecision(0, 3, 1)
    # request 1's prefill leg ends on prefill 0: its load leaves prefill 0 only (decode 2 still holds 4 blocks)
    router.on_event(Finished(1, 0, 0.5, 1))
    # prefill 0 = 2 + 2 = 4, prefill 1 = (32 + 32)/16 + 2 + 2 = 8; decode 2 = 4 + 2 = 6, decode 3 = 2 + 2 = 4
    assert _route(router, _req(3, 32), state) == PairDecision(0, 3, 0)


def _joint_state(prefill_backlog):
    """Prefill instances with ``prefill_backlog`` prompt tokens each waiting; two requests decoding on each decode
    instance."""
    state = _state([(0, prefill_backlog[0]), (1, prefill_backlog[1])])
    for k, inst in enumerate((2, 2, 3, 3)):
        state.apply(Dispatched(Request(2000 + k, 0.0, 10, 100), inst, 0.0))
        state.apply(FirstToken(2000 + k, inst, 0.1))
    return state


def test_joint_picks_the_pair_of_least_predicted_completion():
    router = get_router("pd_joint", num_instances=4, kv_link="1e9", kv_bytes_per_token=1000.0)
    state = _joint_state((500, 0))
    view, r = state.view(), _req(1, 1000)
    # a token takes 0.02 + (2 + 1)/50 = 0.08 s: 10 tokens 0.8 s. Pair (1, 2): 1000/5000 + 0.02 to prefill,
    # 999 x 1000 B at 1 GB/s to move, no backlog on decode 2, then 0.8 s
    assert router.cost_s(r, view, 2, 1) == pytest.approx(0.22 + 0.000999 + 0.8)
    assert router.cost_s(r, view, 2, 0) == pytest.approx(0.32 + 0.000999 + 0.8)  # behind 500 tokens
    # whole on decode 2: 0.22 + 0.8, and its 0.2 s prefill stalls the 2 requests decoding there: + 0.4
    assert router.cost_s(r, view, 2, None) == pytest.approx(1.02 + 0.4)
    assert _route(router, r, state) == PairDecision(0, 2, 1)  # decode 2 and 3 tie: the lower index


def test_joint_serves_whole_when_the_prefill_instances_are_backed_up_or_the_prompt_is_short():
    router = get_router("pd_joint", num_instances=4, kv_link="1e9", kv_bytes_per_token=1000.0)
    state = _joint_state((5000, 5000))
    r = _req(1, 1000)
    # a pair now costs (5000 + 1000)/5000 + 0.02 + 0.000999 + 0.8 = 2.021; whole costs 1.42
    assert router.cost_s(r, state.view(), 3, 0) == pytest.approx(1.22 + 0.000999 + 0.8)
    assert _route(router, r, state) == PairDecision(0, 2, None)
    # 10 tokens (<= 16): whole, no pair considered, even with idle prefill instances
    assert _route(router, _req(2, 10), _joint_state((0, 0))) == PairDecision(0, 2, None)
    assert _route(router, _req(3, 200), _joint_state((0, 0))) == PairDecision(0, 2, 0)  # 200: a pair again


def _send(router, state, request, decision):
    """Apply ``decision`` for ``request`` as the dispatcher does: its prefill leg is seen on the prefill instance."""
    ev = Dispatched(prefill_leg(request) if decision.prefill is not None else request,
                    decision.prefill if decision.prefill is not None else decision.instance, 0.0)
    state.apply(ev)
    router.on_event(ev)


def test_joint_charges_a_local_prefill_to_every_request_decoding_there_meanwhile():
    router = get_router("pd_joint", num_instances=4, kv_link="1e9", kv_bytes_per_token=1000.0)
    state = _joint_state((0, 0))
    r1 = _req(1, 1000)
    d1 = _route(router, r1, state)
    assert d1 == PairDecision(0, 2, 0)  # pair 1.020999 against whole 1.42 (the test above)
    _send(router, state, r1, d1)
    assert router.committed.num_requests == [0, 0, 1, 0]
    # r1 prefills on 0 (1,000 tokens: done in 1000/5000 + 0.02 = 0.22 s); a 1,000-token prefill on decode 2
    # takes 0.2 s, so r1's KV is expected to land within it with probability 0.2 / 0.22: it is stalled too
    view = state.view()
    assert router.num_stalled(view, 2, 1000) == pytest.approx(2 + 0.2 / 0.22)
    assert router.num_stalled(view, 3, 1000) == pytest.approx(2)
    r2 = _req(2, 1000)
    assert router.cost_s(r2, view, 2, None) == pytest.approx(1.02 + (2 + 0.2 / 0.22) * 0.2)
    # a 4,000-token prefill on decode 2 outlasts r1's prefill (0.8 s > 0.22 s): r1 counts whole
    assert router.num_stalled(view, 2, 4000) == pytest.approx(3)
    # r1's prefill is done and its transfer starts: the view shows it on decode 2, no longer committed
    for ev in (Finished(1, 0, 0.22, 1), Dispatched(r1, 2, 0.22)):
        state.apply(ev)
        router.on_event(ev)
    assert router.committed.num_requests == [0, 0, 0, 0]
    view = state.view()
    assert view.instances[2].num_outstanding == 3 and view.instances[2].num_decoding == 2
    # it is not decoding yet, but will be during the prefill: 3 stalled
    assert router.num_stalled(view, 2, 1000) == pytest.approx(3)


def test_joint_forgets_a_pair_whose_prefill_failed():
    router = get_router("pd_joint", num_instances=4, kv_link="1e9", kv_bytes_per_token=1000.0)
    state = _joint_state((0, 0))
    r1 = _req(1, 1000)
    d1 = _route(router, r1, state)
    _send(router, state, r1, d1)
    router.on_event(Failed(1, 0, 0.1, "prefill failed"))
    assert router.committed.num_requests == [0, 0, 0, 0] and not router.committed.decode_of


def test_joint_forgets_a_pair_whose_first_token_comes_from_its_decode_instance():
    # a backend that reports no transfer start: the first token on the decode instance ends the commitment,
    # the prefill leg's own token (on the prefill instance) does not
    router = get_router("pd_joint", num_instances=4, kv_link="1e9", kv_bytes_per_token=1000.0)
    state = _joint_state((0, 0))
    r1 = _req(1, 1000)
    _send(router, state, r1, _route(router, r1, state))
    router.on_event(FirstToken(1, 0, 0.22))
    assert router.committed.num_requests == [0, 0, 1, 0]
    router.on_event(FirstToken(1, 2, 0.3))
    assert router.committed.num_requests == [0, 0, 0, 0] and not router.committed.decode_of


def test_no_decode_candidate_defers():
    state = ClusterState([InstanceSpec(role="prefill")])
    for name in ("pd_llmd", "pd_dynamo", "pd_vllm", "pd_joint"):
        assert get_router(name, num_instances=1).route([_req(1, 100)], state.view(), 0.0) is None
