"""Stale signals (``Dispatcher(signal_lag_s=...)``): the router's view and its event hook get what the instances
report that many seconds late and its own dispatches at once; in the simulator every view a router sees counts
exactly the requests dispatched before it less those that finished at least the lag earlier; a negative lag is
bad input (the library's field, the flags' one line)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.core import ClusterState, Decision, Dispatched, Finished, FirstToken, InstanceSpec, Request
from lbbench.dispatch import Dispatcher
from lbbench.errors import InputError
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads import paper_mix
from factories import tiny_profile


class Seen:
    """Least outstanding first; records the time, its view's outstanding counts, and the events it saw."""

    name = "seen"

    def __init__(self):
        self.views: list[tuple[float, tuple[int, ...]]] = []
        self.events: list[tuple[str, float]] = []

    def on_event(self, ev):
        self.events.append((type(ev).__name__, ev.time_s))

    def route(self, queue, view, now_s):
        counts = tuple(iv.num_outstanding for iv in view.instances)
        self.views.append((now_s, counts))
        return Decision(0, min(range(len(counts)), key=lambda i: (counts[i], i)))


def test_the_router_sees_reports_late_and_its_own_dispatches_at_once():
    router = Seen()
    disp = Dispatcher(router, ClusterState([InstanceSpec()] * 2), signal_lag_s=0.5)
    disp.arrive(Request(0, 0.0, 10, 10))
    assert disp.decide(0.0) == [(Request(0, 0.0, 10, 10), 0)]
    disp.observe(FirstToken(0, 0, 0.2))
    disp.observe(Finished(0, 0, 1.0, 10))
    assert disp.state.view().instances[0].num_outstanding == 0  # the dispatcher's own state is current
    assert disp.view(1.2).instances[0].num_outstanding == 1  # the finish is 0.2 s old: not seen yet
    assert router.events == [("Dispatched", 0.0), ("FirstToken", 0.2)]
    assert disp.view(1.5).instances[0].num_outstanding == 0
    assert router.events[-1] == ("Finished", 1.0)
    disp.arrive(Request(1, 1.2, 10, 10))
    disp.arrive(Request(2, 1.2, 10, 10))
    disp.decide(1.2)
    assert router.views[-2:] == [(1.2, (0, 0)), (1.2, (1, 0))]  # its own dispatch counted at once


def test_a_negative_lag_is_bad_input():
    with pytest.raises(InputError, match=r"^signal_lag_s: -0.1 must be >= 0 seconds"):
        Dispatcher(Seen(), ClusterState([InstanceSpec()]), signal_lag_s=-0.1)
    res = CliRunner().invoke(main, ["run", "--requests", "5", "--signal-lag-s", "-1"])
    assert res.exit_code == 2 and res.output.strip() == "Error: --signal-lag-s: -1 must be >= 0 seconds"


@pytest.mark.parametrize("lag_s", [0.0, 0.3, 2.0])
def test_every_view_in_the_simulator_is_the_cluster_lag_seconds_ago(lag_s):
    prof = tiny_profile(num_kv_blocks=4000)
    reqs = [Request(r.request_id, r.arrival_s, min(r.prompt_tokens, 60), min(r.output_tokens, 60))
            for r in paper_mix(200, 30.0, 0)]
    router = Seen()
    recs = ClusterSim(prof, 3, reqs, seed=0, signal_lag_s=lag_s).run(router)
    assert len(recs) == 200 and all(r.error is None for r in recs)
    over = prof.api_overhead_s  # records see finishes later by the front end's latency; the events do not
    for now_s, counts in router.views:
        sent = sum(r.dispatch_s < now_s for r in recs)
        done = sum(r.finish_s - over <= now_s - lag_s for r in recs)
        assert sum(counts) >= sent - done - sum(r.dispatch_s == now_s for r in recs)
        assert sum(counts) <= sent - done + sum(r.dispatch_s == now_s for r in recs)


def test_a_lag_changes_what_a_load_aware_router_decides_and_a_clone_keeps_its_own_view():
    prof = tiny_profile(num_kv_blocks=4000)
    reqs = [Request(r.request_id, r.arrival_s, min(r.prompt_tokens, 60), min(r.output_tokens, 60))
            for r in paper_mix(200, 30.0, 0)]

    def placements(lag_s):
        sim = ClusterSim(prof, 3, reqs, seed=0, signal_lag_s=lag_s)
        recs = sim.run(get_router("least_requests", num_instances=3, seed=0))
        return [r.instance for r in sorted(recs, key=lambda r: r.request_id)]
    assert placements(0.0) != placements(2.0)
    sim = ClusterSim(prof, 3, reqs, seed=0, signal_lag_s=1.0)
    sim.set_router(get_router("least_requests", num_instances=3, seed=0), "least_requests")
    sim.run_until(2.0)
    fork = sim.clone()
    fork.run_until(1e9)
    sim.run_until(1e9)
    key = lambda r: (r.request_id, r.instance, r.finish_s)  # noqa: E731
    assert sorted(map(key, fork.records)) == sorted(map(key, sim.records))
