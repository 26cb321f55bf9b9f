"""The simulator with one profile per instance (a mixed fleet)."""

from __future__ import annotations

import copy
import math

import pytest

from lbbench.fleet import Fleet, FleetEntry
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim
from tests.factories import req, tiny_profile


def _key(rec):
    return (rec.request_id, rec.instance, rec.dispatch_s, rec.first_token_s, rec.finish_s, rec.generated_tokens,
            rec.num_preemptions, rec.tbt_mean_s, rec.tbt_p99_s, rec.tbt_max_s, rec.error)


def _two_step_models():
    # no context term, so a step's time is base + a * prefill tokens + b * decode sequences
    fast = tiny_profile(name="fast", base_s=0.01, prefill_token_s=1e-3, decode_seq_s=2e-3, context_token_s=0.0,
                        min_step_s=0.01)
    slow = tiny_profile(name="slow", base_s=0.02, prefill_token_s=2e-3, decode_seq_s=5e-3, context_token_s=0.0,
                        min_step_s=0.02, api_overhead_s=0.005)
    return fast, slow


def test_hand_computed_two_instance_case_each_request_takes_its_own_instances_step_times():
    """One request per instance (prompt 8, output 5), both at t=0, round robin: request 0 on the fast
    instance, 1 on the slow one. Each runs a prefill step (8 prompt tokens, the first token) and 4 decode
    steps of one sequence. Fast: (0.01 + 8 * 0.001) + 4 * (0.01 + 0.002) = 0.066 s. Slow:
    (0.02 + 8 * 0.002) + 4 * (0.02 + 0.005) = 0.136 s, plus its front end's 0.005 s: 0.141 s."""
    fast, slow = _two_step_models()
    sim = ClusterSim(None, 2, [req(0, 0.0, 8, 5), req(1, 0.0, 8, 5)], profiles=[fast, slow])
    recs = {r.request_id: r for r in sim.run(get_router("round_robin", num_instances=2))}
    assert recs[0].instance == 0 and recs[1].instance == 1
    assert recs[0].finish_s - recs[0].arrival_s == pytest.approx(0.066, abs=1e-12)
    assert recs[0].first_token_s == pytest.approx(0.018, abs=1e-12)
    assert recs[1].finish_s - recs[1].arrival_s == pytest.approx(0.141, abs=1e-12)
    assert recs[1].first_token_s == pytest.approx(0.036 + 0.005, abs=1e-12)


def test_each_instance_has_its_own_spec_engine_settings_and_the_timer_is_the_fleets_shortest_step():
    fast, slow = _two_step_models()
    slow = slow.with_overrides(max_num_seqs=2, chunked_prefill=True, num_kv_blocks=16)
    sim = ClusterSim(None, 2, [req(0, 0.0, 8, 5)], profiles=[slow, fast])
    assert sim.profile is slow and sim.profiles == [slow, fast]
    assert [i.profile.name for i in sim.instances] == ["slow", "fast"]
    assert [i.max_num_seqs for i in sim.instances] == [2, 8]
    assert [i.chunked_prefill for i in sim.instances] == [True, False]
    assert [i.num_blocks for i in sim.instances] == [16, 64]
    specs = [iv.spec for iv in sim.view().instances]
    assert [s.profile_name for s in specs] == ["slow", "fast"]
    assert [s.kv_capacity_tokens for s in specs] == [64, 256]
    assert sim.dt_s == 0.01
    # a run-wide override still applies to every instance
    sim = ClusterSim(None, 2, [req(0, 0.0, 8, 5)], profiles=[slow, fast], chunked_prefill=False)
    assert [i.chunked_prefill for i in sim.instances] == [False, False]


def test_bad_profiles_are_refused():
    fast, slow = _two_step_models()
    with pytest.raises(ValueError, match="2 profiles for 3 instances"):
        ClusterSim(None, 3, [], profiles=[fast, slow])
    with pytest.raises(ValueError, match="first of profiles"):
        ClusterSim(slow, 2, [], profiles=[fast, slow])


def _kv_fleet():
    big = tiny_profile(name="big", num_kv_blocks=200)
    small = tiny_profile(name="small", num_kv_blocks=12)  # 48 tokens: four requests of 28 tokens do not fit
    return big, small


def _kv_requests():
    return [req(i, 0.001 * i, 8, 20) for i in range(8)]


def test_preemption_happens_only_on_the_instance_with_the_small_kv_cache():
    big, small = _kv_fleet()
    sim = ClusterSim(None, 2, _kv_requests(), profiles=[big, small], check_invariants=True)
    recs = sim.run(get_router("round_robin", num_instances=2))
    assert len(recs) == 8 and all(r.error is None for r in recs)
    assert sum(r.num_preemptions for r in recs if r.instance == 1) > 0
    assert all(r.num_preemptions == 0 for r in recs if r.instance == 0)
    assert sim.instances[0].num_preemptions == 0 < sim.instances[1].num_preemptions


@pytest.mark.parametrize("cut_s", [0.0, 0.05, 0.2])
def test_a_clone_of_a_mixed_fleet_runs_to_the_same_records(cut_s):
    big, small = _kv_fleet()
    fast, _ = _two_step_models()
    profiles = [big, small, fast]
    sim = ClusterSim(None, 3, _kv_requests() + [req(8, 0.1, 30, 12)], profiles=profiles, check_invariants=True)
    r = get_router("jsq", num_instances=3)
    sim.set_router(r)
    sim.run_until(cut_s)
    fork = sim.clone()
    assert fork.profiles == sim.profiles and all(a is b for a, b in zip(fork.profiles, sim.profiles))
    fork.set_router(copy.deepcopy(r))
    for s in (fork, sim):  # the fork first: running it must leave the original untouched
        s.run_until(math.inf)
    assert len(sim.records) == 9
    assert sorted(map(_key, fork.records)) == sorted(map(_key, sim.records))


def test_a_uniform_fleet_given_per_instance_gives_the_records_of_one_profile():
    p = tiny_profile(num_kv_blocks=24, api_overhead_s=0.003)
    reqs = [req(i, 0.01 * i, 5 + 3 * i % 17, 4 + 7 * i % 23) for i in range(30)]
    want = ClusterSim(p, 3, reqs).run(get_router("jsq", num_instances=3))
    got = ClusterSim(p, 3, reqs, profiles=[p] * 3).run(get_router("jsq", num_instances=3))
    fleet = ClusterSim.for_fleet(Fleet((FleetEntry(p, 3),)), reqs).run(get_router("jsq", num_instances=3))
    assert [_key(r) for r in got] == [_key(r) for r in want] == [_key(r) for r in fleet]
    assert any(r.num_preemptions for r in want)


def test_for_fleet_puts_each_entrys_profile_on_its_instances():
    big, small = _kv_fleet()
    sim = ClusterSim.for_fleet(Fleet((FleetEntry(big, 2), FleetEntry(small, 1))), [req(0, 0.0, 4, 4)])
    assert [i.profile.name for i in sim.instances] == ["big", "big", "small"]
