"""vLLM's priority scheduling policy in the simulator: waiting order, preemption victim, priorities."""

from dataclasses import replace

from hypothesis import given, settings, strategies as st

from lbbench.core import Finished, FirstToken, Preempted
from lbbench.priority import job_time_s, request_priority
from lbbench.sim.instance import SimInstance
from factories import req, tiny_profile


def _run(inst, reqs):
    ev = []
    for r in reqs:
        ev += inst.add(r, r.arrival_s)
    return ev + inst.advance(float("inf"))


def test_priority_is_predicted_work_in_ms():
    p = tiny_profile()  # 1e-4 s per prompt token, 0.01 s per decode step
    r = req(0, 0.0, prompt=100, output=30)
    assert job_time_s(r, p) == 100 * 1e-4 + 30 * 0.01
    assert request_priority(r, p) == 310
    # the prediction, not the true length, sets it
    assert request_priority(replace(r, predicted_output_tokens=5), p) == 60


def test_waiting_queue_is_served_by_priority_then_arrival():
    p = tiny_profile(max_num_seqs=1)
    reqs = [req(0, 0.0, 8, 20), req(1, 0.001, 8, 40), req(2, 0.002, 8, 5), req(3, 0.003, 8, 10),
            req(4, 0.004, 8, 5)]
    order = {}
    for sched in ("fcfs", "priority"):
        ev = _run(SimInstance(p, scheduler=sched, check_invariants=True), reqs)
        order[sched] = [e.request_id for e in ev if isinstance(e, FirstToken)]
    assert order["fcfs"] == [0, 1, 2, 3, 4]
    # 0 is already running; then smallest predicted work first, ties (2 and 4) by arrival
    assert order["priority"] == [0, 2, 4, 3, 1]


def test_kv_exhaustion_preempts_the_lowest_priority_not_the_newest():
    p = tiny_profile(num_kv_blocks=12, block_size=4, max_model_len=48)
    reqs = [req(0, 0.0, 8, 30), req(1, 0.001, 8, 10), req(2, 0.002, 8, 14)]
    first_victim = {}
    for sched in ("fcfs", "priority"):
        ev = _run(SimInstance(p, scheduler=sched, check_invariants=True), reqs)
        assert sorted(e.request_id for e in ev if isinstance(e, Finished)) == [0, 1, 2]
        first_victim[sched] = next(e.request_id for e in ev if isinstance(e, Preempted))
    assert first_victim["fcfs"] == 2  # the newest
    assert first_victim["priority"] == 0  # the most predicted work, although the oldest


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2), st.integers(1, 40), st.integers(1, 40), st.integers(1, 60)),
                min_size=1, max_size=25))
def test_priority_policy_keeps_invariants_and_finishes_everything(specs):
    p = tiny_profile(num_kv_blocks=24, block_size=4, max_model_len=96)
    reqs = sorted((replace(req(i, t, a, b), predicted_output_tokens=c) for i, (t, a, b, c) in enumerate(specs)),
                  key=lambda r: r.arrival_s)
    ev = _run(SimInstance(p, scheduler="priority", check_invariants=True), reqs)
    finished = [e.request_id for e in ev if isinstance(e, Finished)]
    assert sorted(finished) == sorted(r.request_id for r in reqs)
    tokens = {e.request_id: e.output_tokens for e in ev if isinstance(e, Finished)}
    assert all(tokens[r.request_id] == r.output_tokens for r in reqs)
