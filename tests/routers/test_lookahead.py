"""The oracle planner ``lookahead`` and the simulator forks it relies on."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbbench.core import Request
from lbbench.routers import get_router
from lbbench.routers.lookahead import LookaheadRouter, PlannerError, plan_action
from lbbench.sim.cluster import ClusterSim
from lbbench.training.teachers import make_teacher
from tests.factories import req, tiny_profile

workloads = st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=8)


def _requests(rows):
    rows = sorted(rows, key=lambda r: r[0])
    return [req(i, t, p, o) for i, (t, p, o) in enumerate(rows)]


def _mean_e2e(records) -> float:
    return float(np.mean([r.finish_s - r.arrival_s for r in records]))


def _key(rec):
    return (rec.request_id, rec.instance, rec.dispatch_s, rec.first_token_s, rec.finish_s, rec.generated_tokens,
            rec.num_preemptions, rec.tbt_mean_s, rec.tbt_p99_s, rec.tbt_max_s, rec.error)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=workloads, cut=st.integers(0, 60), router=st.sampled_from(["jsq", "late_binding_srpt"]))
def test_a_fork_run_to_completion_gives_the_original_records(rows, cut, router):
    profile = tiny_profile(num_kv_blocks=24)
    reqs = _requests(rows)
    sim = ClusterSim(profile, 2, reqs, check_invariants=True)
    r = get_router(router, num_instances=2, profile=profile)
    sim.set_router(r)
    sim.run_until(cut * 0.01)
    fork = sim.clone()
    fork.set_router(copy.deepcopy(r))
    for s in (fork, sim):  # the fork first: running it must leave the original untouched
        s.run_until(math.inf)
    assert sorted(map(_key, fork.records)) == sorted(map(_key, sim.records))
    assert len(sim.records) == len(reqs)


def test_a_fork_does_not_share_mutable_state():
    profile = tiny_profile()
    sim = ClusterSim(profile, 2, [req(0, 0.0, 8, 20), req(1, 0.0, 8, 20)])
    sim.advance(0.0)
    sim.dispatch(0, 0)
    fork = sim.clone()
    assert fork.instances[0].reqs.keys() == sim.instances[0].reqs.keys() == {0}
    assert fork.instances[0].reqs[0] is not sim.instances[0].reqs[0]
    fork.dispatch(0, 1)
    fork.advance(1.0)
    assert len(fork.records) == 2 and not sim.records
    assert len(sim.queue) == 1 and sim.now_s == 0.0
    assert sim.instances[1].num_waiting + sim.instances[1].num_running == 0
    assert sim.state.view().instances[1].num_outstanding == 0
    assert sim.instances[0].reqs[0].generated == 0


def _unit_profile():
    # every step takes exactly 10 ms and an instance runs one request at a time: a request of output L
    # occupies its instance for L steps (the prefill step makes the first token)
    return tiny_profile(base_s=0.01, prefill_token_s=0.0, decode_seq_s=0.0, context_token_s=0.0, max_num_seqs=1)


def test_hand_case_planner_keeps_short_requests_off_the_long_ones_instance():
    """2 instances, all at t=0 in this order: A (10 tokens), B (100), C (10), D (10), no margin. Round robin alternates:
    A and C on instance 0 (E2E 0.1 and 0.2 s), B and D on 1 (1.0 and 1.1 s): mean 2.4 / 4. The planner
    with exact rollouts of a round-robin base (a copy of the live base per rollout, so its next pick is the
    instance after the last placement) takes A to 0 (A to 1 ties), sends B to 1 (B to 0 would cost 2.5), takes C
    to 0 (C to 1 ties), and sends D behind C on 0
    instead of behind B: A 0.1, B 1.0, C 0.2, D 0.3 s, mean 1.6 / 4."""
    profile = _unit_profile()
    reqs = [req(0, 0.0, 4, 10), req(1, 0.0, 4, 100), req(2, 0.0, 4, 10), req(3, 0.0, 4, 10)]
    rr = ClusterSim(profile, 2, reqs).run(get_router("round_robin", num_instances=2, profile=profile))
    assert _mean_e2e(rr) == pytest.approx(2.4 / 4)
    planner = LookaheadRouter(num_instances=2, profile=profile, base="round_robin", horizon_s="done", refresh_s=0,
                              margin_s=0, screen_s=0)
    recs = ClusterSim(profile, 2, reqs).run(planner)
    e2e = {r.request_id: r.finish_s - r.arrival_s for r in recs}
    assert e2e == pytest.approx({0: 0.1, 1: 1.0, 2: 0.2, 3: 0.3})
    assert [r.instance for r in sorted(recs, key=lambda r: r.request_id)] == [0, 1, 0, 0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=workloads, base=st.sampled_from(["round_robin", "jsq", "gate", "backfill_gate"]),
       reorder=st.booleans(), screen_s=st.sampled_from([0.0, 0.02, 1.0]))
def test_exact_rollouts_are_never_worse_than_the_base_policy(rows, base, reorder, screen_s):
    """Whatever the screen and margin options say: exact rollouts take neither (one stage, strictly cheaper)."""
    profile = tiny_profile(num_kv_blocks=24)
    reqs = _requests(rows)
    planner = LookaheadRouter(num_instances=2, profile=profile, base=base, horizon_s=math.inf, refresh_s=0,
                              reorder=reorder, screen_s=screen_s)
    planned = ClusterSim(profile, 2, reqs).run(planner)
    from lbbench.routers.lookahead import make_base
    ref = ClusterSim(profile, 2, reqs).run(make_base(base, 2, 0, profile))
    assert _mean_e2e(planned) <= _mean_e2e(ref) + 1e-9


def test_plan_action_is_pure_and_matches_the_router():
    profile = tiny_profile(num_kv_blocks=24)
    reqs = [req(i, 0.01 * i, 10 + 3 * i, 30 - 2 * i) for i in range(6)]
    sim = ClusterSim(profile, 2, reqs)
    sim.advance(0.05)
    before = (len(sim.queue), sim.now_s, [len(i.reqs) for i in sim.instances])
    a = plan_action(sim, horizon_s=math.inf, base="jsq")
    assert a is None or (0 <= a.queue_index < len(sim.queue) and 0 <= a.instance < 2)
    assert (len(sim.queue), sim.now_s, [len(i.reqs) for i in sim.instances]) == before
    assert plan_action(sim, horizon_s=math.inf, base="jsq") == a


def test_the_lookahead_teacher_is_the_planners_head_of_line_action():
    profile = tiny_profile(num_kv_blocks=24)
    reqs = [req(i, 0.01 * i, 10 + 3 * i, 30 - 2 * i) for i in range(6)]
    sim = ClusterSim(profile, 2, reqs)
    sim.advance(0.05)
    teacher = make_teacher("lookahead", profile, horizon_s=0.5)
    d = plan_action(sim, reorder=False, horizon_s=0.5)
    assert teacher(sim) == (2 if d is None else d.instance)
    assert d is None or d.queue_index == 0


def test_unbound_planner_and_bad_options_name_the_problem():
    profile = tiny_profile()
    r = LookaheadRouter(num_instances=2, profile=profile)
    with pytest.raises(PlannerError, match="only on the simulator"):
        r.route([req(0, 0.0, 4, 4)], ClusterSim(profile, 2, []).view(), 0.0)
    with pytest.raises(PlannerError, match="horizon_s"):
        LookaheadRouter(num_instances=2, profile=profile, horizon_s=-1)
    with pytest.raises(PlannerError, match="unknown option"):
        LookaheadRouter(num_instances=2, profile=profile, depth=3)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.floats(0, 2.0), st.integers(1, 60), st.integers(1, 60)), min_size=1,
                     max_size=30),
       refresh_s=st.sampled_from([0.0, 0.05, 1.0]))
def test_the_gate_rollout_skips_only_deferrals_the_gate_would_make(rows, refresh_s):
    """A rollout's epochs for a late_binding_srpt base skip the router while it would defer: the records are
    the plain dispatcher's, and the router is asked less often."""
    from lbbench.routers.lookahead import GateIdleGuard
    profile = tiny_profile(num_kv_blocks=24)
    reqs = _requests(rows)
    runs = []
    for skip in (False, True):
        sim = ClusterSim(profile, 2, reqs, check_invariants=True)
        gate = get_router("late_binding_srpt", num_instances=2, profile=profile, order="fcfs", kv_slack=0.0,
                          refresh_s=refresh_s, calibrate=False)
        calls = []
        route = gate.route
        gate.route = lambda q, v, t: calls.append(t) or route(q, v, t)
        sim.set_router(gate)
        if skip:
            sim.dispatcher.guard = GateIdleGuard(sim, gate)
        sim.run_until(math.inf)
        runs.append((sorted(map(_key, sim.records)), len(calls)))
    assert runs[1][0] == runs[0][0]
    assert len(runs[1][0]) == len(reqs)
    assert runs[1][1] <= runs[0][1]


def test_the_gate_guard_lets_an_emptied_queue_through():
    """A queue emptied outside the dispatcher's epochs (``drop``) after a deferral: the guard does not read a
    head that is gone, and the epoch decides nothing."""
    from lbbench.routers.lookahead import GateIdleGuard
    profile = tiny_profile(num_kv_blocks=24)  # 96 tokens: the second request waits for the first
    sim = ClusterSim(profile, 1, [req(0, 0.0, 40, 40), req(1, 0.0, 40, 40)])
    gate = get_router("late_binding_srpt", num_instances=1, profile=profile, order="fcfs", kv_slack=0.0,
                      refresh_s=1.0, calibrate=False)
    sim.set_router(gate)
    sim.dispatcher.guard = guard = GateIdleGuard(sim, gate)
    sim.run_until(0.0)
    assert len(sim.queue) == 1 and guard.last is not None  # deferred, the deferral remembered
    sim.dispatcher.drop(0)
    assert sim.dispatcher.decide(sim.now_s) == []


def test_a_margin_keeps_the_base_policys_action():
    """With a margin no candidate can beat, the planner takes exactly what a fresh base policy takes."""
    profile = tiny_profile(num_kv_blocks=24)
    reqs = [req(i, 0.01 * i, 10 + 3 * i, 30 - 2 * i) for i in range(8)]
    sim = ClusterSim(profile, 2, reqs)
    sim.advance(0.06)
    from lbbench.routers.lookahead import make_base
    for base in ("jsq", "gate"):
        want = make_base(base, 2, 0, profile).route(sim.queue, sim.state.view(detail=True), sim.now_s)
        got = plan_action(sim, horizon_s=0.5, base=base, margin_s=1e9)
        assert got == want
    with pytest.raises(PlannerError, match="margin_s"):
        LookaheadRouter(num_instances=2, profile=profile, margin_s=-0.1)


# ------------------------------------------------------------------------------------------------ mixed fleets


def _mixed_pair():
    """An A100-like and an L4-like instance, scaled down: the second's steps cost about three times as much
    and its KV cache is half the first's."""
    fast = tiny_profile(name="fast", base_s=0.005, prefill_token_s=5e-5, decode_seq_s=5e-5, context_token_s=5e-7,
                        num_kv_blocks=96, min_step_s=0.005)
    slow = tiny_profile(name="slow", base_s=0.015, prefill_token_s=1.5e-4, decode_seq_s=1.5e-4,
                        context_token_s=1.5e-6, num_kv_blocks=48, min_step_s=0.015)
    return fast, slow


def test_each_instance_charges_its_own_per_token_costs():
    from lbbench.routers.lookahead import decode_token_s, instance_costs, rollout_cost
    fast, slow = _mixed_pair()
    reqs = [req(0, 0.0, 40, 60), req(1, 0.0, 40, 60)]
    sim = ClusterSim(None, 2, reqs, profiles=[fast, slow])
    costs = instance_costs(sim)
    assert costs.prefill_token_s == (5e-5, 1.5e-4)
    assert costs.decode_token_s[1] > 2.5 * costs.decode_token_s[0]
    # a request still at the router: the fleet's harmonic mean
    assert costs.queued_decode_token_s == pytest.approx(2 / (1 / costs.decode_token_s[0] + 1 / costs.decode_token_s[1]))
    assert decode_token_s(sim) == costs.queued_decode_token_s
    # uniform fleet: one profile's cost everywhere, as before fleets
    uni = ClusterSim(fast, 2, reqs)
    u = instance_costs(uni)
    assert u.decode_token_s == (u.queued_decode_token_s,) * 2 and u.prefill_token_s == (5e-5, 5e-5)
    # the same request left unfinished costs more on the slow instance, by its own costs: nothing runs in a
    # horizon of 0, so the estimate is the fluid one, (40 * a_i + 60 * tau_i) / 2 for the one request on i
    for i in (0, 1):
        s = ClusterSim(None, 2, reqs[:1], profiles=[fast, slow])
        s.advance(0.0)
        s.dispatch(0, i)
        want = (40 * costs.prefill_token_s[i] + 60 * costs.decode_token_s[i]) / 2
        assert rollout_cost(s, 0.0, 1e-9, 0) == pytest.approx(want + 1e-9)


def _mixed_requests(n: int, seed: int):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / 60.0, n))
    return [req(i, float(t[i]), int(rng.integers(4, 60)), int(rng.integers(2, 80))) for i in range(n)]


def test_exact_rollouts_improve_on_their_base_on_a_mixed_fleet():
    """Policy improvement on a fleet of one fast and one slow instance, 100 requests, the same requests and
    seed for the planner and its base alone."""
    base = "jsq_speed"
    fast, slow = _mixed_pair()
    reqs = _mixed_requests(100, seed=7)
    alone = ClusterSim(None, 2, reqs, profiles=[fast, slow], seed=0).run(get_router(base, num_instances=2))
    planner = LookaheadRouter(num_instances=2, base=base, horizon_s="done", refresh_s=0.0, screen_s=0.0)
    planned = ClusterSim(None, 2, reqs, profiles=[fast, slow], seed=0).run(planner)
    assert len(planned) == len(alone) == 100
    assert _mean_e2e(planned) <= _mean_e2e(alone) + 1e-9
    assert planner.num_replaced > 0


def test_base_best_takes_the_cheapest_base_and_improves_on_it():
    """``base=best`` runs each base to the end on a fork, keeps the cheapest, and then (exact rollouts) is no
    worse than any of them."""
    fast, slow = _mixed_pair()
    reqs = _mixed_requests(80, seed=3)
    bases = ("round_robin", "least_work_speed", "jsq_speed")
    alone = {b: _mean_e2e(ClusterSim(None, 2, reqs, profiles=[fast, slow]).run(get_router(b, num_instances=2)))
             for b in bases}
    planner = LookaheadRouter(num_instances=2, base="best", best_of=",".join(bases), horizon_s="done",
                              refresh_s=0.0, screen_s=0.0)
    planned = ClusterSim(None, 2, reqs, profiles=[fast, slow]).run(planner)
    assert planner.params.base == min(bases, key=alone.get)
    assert {b: c / len(reqs) for b, c in planner.base_costs.items()} == pytest.approx(alone)
    assert _mean_e2e(planned) <= min(alone.values()) + 1e-9
    with pytest.raises(PlannerError, match="best_of"):
        LookaheadRouter(num_instances=2, base="best", best_of="best")
    with pytest.raises(ValueError):
        LookaheadRouter(num_instances=2, base="best", best_of="no_such_router")


# ------------------------------------------------------------------ prefix-heavy traffic: the base's memory, the cache


def _prefix_profile():
    return tiny_profile(num_kv_blocks=400, max_model_len=1200, max_num_batched_tokens=1200, max_num_seqs=16)


def _prefixed(i: int, arrival_s: float, hashes: tuple[int, ...], prompt: int = 200, output: int = 2) -> Request:
    return Request(request_id=i, arrival_s=arrival_s, prompt_tokens=prompt, output_tokens=output,
                   prefix_hashes=hashes, prefix_block_tokens=4)


P_HASHES, Q_HASHES = tuple(range(2000, 2050)), tuple(range(1000, 1050))


def _p_again_at_1s(caching: bool) -> tuple:
    """(profile, requests, simulator): Q to instance 0 and P to instance 1 at t=0, by hand; at t=1 P again waits
    at the router."""
    prof = _prefix_profile()
    reqs = [_prefixed(0, 0.0, Q_HASHES), _prefixed(1, 0.0, P_HASHES), _prefixed(2, 1.0, P_HASHES)]
    sim = ClusterSim(prof, 2, reqs, prefix_caching=caching)
    sim.advance(0.0)
    sim.dispatch(0, 0)
    sim.dispatch(0, 1)
    sim.advance(1.0)
    return prof, reqs, sim


def test_the_planner_keeps_a_request_on_its_cached_prefix():
    """Two idle instances; prompt Q went to instance 0 and prompt P to instance 1 at t=0 (both done by t=1).
    At t=1 P comes again. A fresh ``token_affinity`` (empty prefix index) sees no sticky instance and breaks
    the tie to instance 0, away from the cache: the planner's action as a pure function of the simulator
    (``plan_action``, no history) with a margin no candidate beats. The planner that keeps a live base beside
    the run copies its index into the rollouts: P is sticky to instance 1, where its 196 cached tokens are."""
    prof, reqs, sim = _p_again_at_1s(True)
    assert [r.request_id for r in sim.queue] == [2]
    assert plan_action(sim, base="token_affinity", margin_s=1e9, horizon_s=0.5).instance == 0
    planner = LookaheadRouter(num_instances=2, profile=prof, base="token_affinity", margin_s=1e9, horizon_s=0.5,
                              refresh_s=0)
    recs = {r.request_id: r for r in ClusterSim(prof, 2, reqs, prefix_caching=True).run(planner)}
    assert [recs[i].instance for i in range(3)] == [0, 1, 1]
    assert recs[2].cached_prompt_tokens == 196  # 49 of its 50 4-token blocks (vLLM recomputes the last token)
    assert planner.live.trees.match_blocks(1, reqs[2]) == 4  # the live base saw the planner's placements


def test_the_tail_estimate_credits_the_prefix_cache():
    """P's 200-token prompt waits at the router at t=1, instance 1 caches 196 of its tokens: the fluid estimate
    charges it 4 prompt tokens of prefill (at the best instance's cache) and 2 decode tokens, by hand; without
    prefix caching the whole prompt."""
    from lbbench.routers.lookahead import _unfinished_estimate_s, instance_costs
    for caching, prefill_tokens in ((True, 4), (False, 200)):
        prof, reqs, sim = _p_again_at_1s(caching)
        assert sim.cached_prompt_tokens(1, reqs[2]) == (196 if caching else 0)
        assert sim.cached_prompt_tokens(0, reqs[2]) == 0
        costs = instance_costs(sim)
        work = prefill_tokens * costs.queued_prefill_token_s + 2 * costs.queued_decode_token_s
        est, n = _unfinished_estimate_s(sim, 1.0, 1.5, costs)
        assert n == 1 and est == pytest.approx(0.5 + work / 2)


prefixed_rows = st.lists(st.tuples(st.floats(0, 0.5), st.integers(0, 2), st.integers(1, 30), st.integers(1, 20)),
                         min_size=1, max_size=8)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=prefixed_rows, base=st.sampled_from(["token_affinity", "cache_length_aware", "precise_prefix",
                                                 "kv_overlap"]))
def test_exact_rollouts_are_never_worse_than_a_base_with_memory(rows, base):
    """Prefix-sharing requests (three prefixes), prefix caching on, a base that remembers (prefix index, in-flight
    tokens, KV events): with exact rollouts each copy of the live base is the base as it would be routing alone
    from the start, so the rollout property holds."""
    prof = _prefix_profile()
    rows = sorted(rows, key=lambda r: r[0])
    reqs = [_prefixed(i, t, tuple(range(100 * (g + 1), 100 * (g + 1) + 40)) + (10_000 + i,) * 5, 4 * (40 + own), o)
            for i, (t, g, own, o) in enumerate(rows)]
    planner = LookaheadRouter(num_instances=2, profile=prof, base=base, horizon_s=math.inf, refresh_s=0)
    planned = ClusterSim(prof, 2, reqs, prefix_caching=True).run(planner)
    ref = ClusterSim(prof, 2, reqs, prefix_caching=True).run(get_router(base, num_instances=2, profile=prof))
    assert _mean_e2e(planned) <= _mean_e2e(ref) + 1e-9
