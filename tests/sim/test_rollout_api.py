"""The simulator's public rollout API: clone, set_router, run_until, send, arm_timer, pending_work, SimEvent."""

from __future__ import annotations

import math

from lbbench.core import Decision
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim, PendingWork, SimEvent
from tests.factories import req, tiny_profile


def _key(rec):
    return (rec.request_id, rec.instance, rec.dispatch_s, rec.first_token_s, rec.finish_s, rec.generated_tokens,
            rec.num_preemptions, rec.router, rec.error)


def _workload(n: int = 24):
    return [req(i, 0.02 * i, 8 + (7 * i) % 30, 5 + (11 * i) % 40) for i in range(n)]


class _DeferOnce:
    """Defers the first offer of each request, then sends it to instance 0."""

    name = "defer_once"

    def __init__(self):
        self.seen: set[int] = set()

    def route(self, queue, view, now_s):
        head = queue[0]
        if head.request_id not in self.seen:
            self.seen.add(head.request_id)
            return None
        return Decision(0, 0)


def test_a_clone_run_until_the_end_gives_the_records_of_a_whole_run():
    profile = tiny_profile(num_kv_blocks=24)
    reqs = _workload()
    want = ClusterSim(profile, 2, reqs).run(get_router("jsq", num_instances=2, profile=profile))
    sim = ClusterSim(profile, 2, reqs)
    sim.set_router(get_router("jsq", num_instances=2, profile=profile), label="jsq")
    sim.run_until(0.2)
    assert 0.0 < sim.now_s <= 0.2 and not sim.done
    fork = sim.clone()
    fork.run_until(math.inf)
    assert fork.done and not sim.done  # the original did not move
    assert sorted(map(_key, fork.records)) == sorted(map(_key, want))
    sim.run_until(math.inf)
    assert sorted(map(_key, sim.records)) == sorted(map(_key, want))


def test_run_until_stops_at_the_time_and_set_router_labels_what_comes():
    profile = tiny_profile()
    sim = ClusterSim(profile, 2, _workload(6))
    sim.set_router(get_router("round_robin", num_instances=2), label="first")
    sim.run_until(0.05)
    assert sim.next_event_s() > 0.05
    n = len(sim.records)
    sim.set_router(get_router("jsq", num_instances=2), label="second")
    assert sim.dispatcher.router.name == "jsq"
    sim.run_until(math.inf)
    assert {r.router for r in sim.records[n:]} == {"second"}
    assert sim.done and len(sim.records) == 6


def test_a_deferral_arms_the_named_timer_one_step_later():
    assert [int(k) for k in (SimEvent.WAKE, SimEvent.ARRIVAL, SimEvent.TIMER, SimEvent.SAMPLE)] == [0, 1, 2, 3]
    profile = tiny_profile()
    sim = ClusterSim(profile, 1, [req(0, 0.1, 10, 5)])
    sim.set_router(_DeferOnce())
    sim.run_until(0.1)  # the arrival: the router defers, the timer is armed
    assert len(sim.queue) == 1 and sim.timer_pending
    assert sim.next_event_s() == 0.1 + profile.min_step_s
    assert sim.arm_timer() is False  # one pending offer at a time
    sim.run_until(0.1 + profile.min_step_s)  # the timer's epoch dispatches it
    assert not sim.queue and not sim.timer_pending
    sim.run_until(math.inf)
    assert sim.records[0].dispatch_s == 0.1 + profile.min_step_s


def test_send_carries_out_dispatches_decided_outside_the_loop():
    profile = tiny_profile()
    sim = ClusterSim(profile, 2, [req(0, 0.0, 10, 5), req(1, 0.0, 12, 4)])
    sim.advance(0.0)  # step-wise: both wait at the router
    assert len(sim.queue) == 2 and not sim.timer_pending
    r = sim.dispatcher.dispatch(1, 1, sim.now_s)
    sim.send([(r, 1)])
    assert sim.timer_pending  # one still waits: the next offer is scheduled
    assert [(w.instance, w.request.request_id) for w in sim.pending_work()] == [(1, 1), (None, 0)]


def test_pending_work_follows_the_engines_progress():
    profile = tiny_profile()
    sim = ClusterSim(profile, 1, [req(0, 0.0, 10, 30), req(1, 0.0, 6, 30)])
    sim.advance(0.0)
    assert sim.pending_work() == [PendingWork(None, sim.queue[0], 0, 0), PendingWork(None, sim.queue[1], 0, 0)]
    sim.dispatch(0, 0)
    sim.dispatch(0, 0)
    sim.advance(0.1)
    inst = sim.instances[0]
    rows = sim.pending_work()
    assert [w.request.request_id for w in rows] == [0, 1]
    for w in rows:
        assert w.instance == 0
        assert 0 < w.generated_tokens == inst.generated_tokens(w.request.request_id) < 30
        assert w.computed_tokens >= w.request.prompt_tokens + w.generated_tokens - 1
    sim.set_router(get_router("round_robin", num_instances=1))
    sim.run_until(math.inf)
    assert sim.pending_work() == []


def test_an_epoch_guard_spares_the_router():
    profile = tiny_profile()
    calls = []

    class Guard:
        def skip(self, now_s):
            return now_s < 0.05

        def decided(self, now_s):
            calls.append(now_s)

    sim = ClusterSim(profile, 1, [req(0, 0.0, 10, 5)])
    sim.set_router(get_router("round_robin", num_instances=1))
    sim.dispatcher.guard = Guard()
    assert sim.clone().dispatcher.guard is None  # a guard reads its own simulator's state
    sim.run_until(math.inf)
    assert calls and min(calls) >= 0.05
    assert sim.records[0].dispatch_s >= 0.05
