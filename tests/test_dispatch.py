"""The dispatcher: defer, reorder, invalid decisions, shared by the simulator."""

import pytest

from lbbench.core import ClusterState, Decision, InstanceSpec
from lbbench.dispatch import Dispatcher, RouterError
from lbbench.sim.cluster import ClusterSim
from factories import req, tiny_profile


class Deferring:
    """Holds requests until an instance has nothing outstanding."""
    name = "idle_only"

    def route(self, queue, view, now_s):
        for iv in view.instances:
            if iv.num_outstanding == 0:
                return Decision(0, iv.index)
        return None


class LongestFirst:
    name = "longest_first"

    def route(self, queue, view, now_s):
        qi = max(range(len(queue)), key=lambda k: queue[k].output_tokens)
        return Decision(qi, 0)


def test_defer_stops_the_epoch_and_keeps_order():
    state = ClusterState([InstanceSpec()])
    d = Dispatcher(Deferring(), state)
    for i in range(3):
        d.arrive(req(i, 0.0, 5, 5))
    out = d.decide(0.0)
    assert [(r.request_id, i) for r, i in out] == [(0, 0)]
    assert [r.request_id for r in d.queue] == [1, 2]
    assert d.num_deferrals == 1
    assert state.view().instances[0].num_outstanding == 1


def test_reordering_router_picks_any_queued_request():
    d = Dispatcher(LongestFirst(), ClusterState([InstanceSpec()]))
    for i, o in enumerate([3, 9, 5]):
        d.arrive(req(i, 0.0, 5, o))
    assert [r.request_id for r, _ in d.decide(0.0)] == [1, 2, 0]


def test_invalid_decision_is_an_error():
    class Bad:
        name = "bad"

        def route(self, queue, view, now_s):
            return Decision(0, 7)
    d = Dispatcher(Bad(), ClusterState([InstanceSpec()]))
    d.arrive(req(0, 0.0, 5, 5))
    with pytest.raises(RouterError, match="invalid decision"):
        d.decide(0.0)


def test_simulator_honours_deferral_and_router_wait():
    prof = tiny_profile()
    reqs = [req(i, 0.0, 5, 20) for i in range(4)]
    recs = ClusterSim(prof, 2, reqs).run(Deferring())
    assert len(recs) == 4
    waits = sorted(r.dispatch_s - r.arrival_s for r in recs)
    assert waits[0] == 0 and waits[1] == 0 and waits[2] > 0  # two wait for an idle instance
    # a request is only dispatched to an instance with nothing outstanding
    by_inst = {}
    for r in sorted(recs, key=lambda r: r.dispatch_s):
        prev = by_inst.get(r.instance)
        assert prev is None or prev.finish_s <= r.dispatch_s + 1e-9
        by_inst[r.instance] = r
