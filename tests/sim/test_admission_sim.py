"""Flow control in the simulator: a shed request is a record (no instance, its status and why), never dropped;
goodput and SLO attainment count it as a miss; limits nothing reaches give the records of a run without flow
control; a session goes on after a refused turn; a clone holds its own queue."""

from __future__ import annotations

import polars as pl

from lbbench.admission import AdmissionSpec
from lbbench.core import RECORD_FIELDS, Request
from lbbench.metrics.summary import Slo, summarize
from lbbench.rundir import records_frame
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads import paper_mix
from factories import tiny_profile
from test_properties import RR


def burst(n: int) -> list[Request]:
    return [Request(i, i * 1e-3, 40, 40) for i in range(n)]


def test_a_shed_request_is_a_record_and_goodput_counts_it_as_a_miss():
    prof = tiny_profile()
    sim = ClusterSim(prof, 1, burst(5), admission=AdmissionSpec(max_queue=1, max_outstanding=1), seed=0)
    recs = sim.run(RR(1))
    assert sorted(r.request_id for r in recs) == [0, 1, 2, 3, 4]  # nothing dropped
    shed = {r.request_id: r for r in recs if r.http_status is not None}
    # r0 goes to the idle instance, r1 is held; r2, r3, r4 each find the queue full (429)
    assert sorted(shed) == [2, 3, 4]
    for r in shed.values():
        assert r.http_status == 429 and r.instance == -1 and r.finish_s is None and r.generated_tokens == 0
        assert r.error == "shed by flow control (429): queue at capacity"
        assert r.dispatch_s == r.arrival_s  # refused on arrival
    served = sorted((r for r in recs if r.http_status is None), key=lambda r: r.request_id)
    assert served[1].dispatch_s >= served[0].finish_s - prof.api_overhead_s  # held until r0 left
    row = summarize(records_frame(recs, {}), slo=Slo()).row(0, named=True)
    assert (row["completed"], row["failed"]) == (2, 3)
    assert row["slo_attainment"] == 0.4
    span = max(r.finish_s for r in served) - 0.0
    assert abs(row["goodput_per_s"] - 2 / span) < 1e-9


def test_limits_nothing_reaches_give_the_records_of_a_run_without_flow_control():
    prof = tiny_profile(num_kv_blocks=2000)
    reqs = paper_mix(300, 20.0, 0)
    reqs = [Request(r.request_id, r.arrival_s, min(r.prompt_tokens, 100), min(r.output_tokens, 100))
            for r in reqs]
    plain = ClusterSim(prof, 3, reqs, seed=0).run(RR(3))
    held = ClusterSim(prof, 3, reqs, seed=0, admission=AdmissionSpec(10_000, 10_000)).run(RR(3))
    key = lambda r: tuple(getattr(r, f) for f in RECORD_FIELDS)  # noqa: E731
    assert sorted(map(key, plain)) == sorted(map(key, held))


def test_flow_control_holds_requests_while_the_pool_is_full():
    prof = tiny_profile(num_kv_blocks=2000)
    reqs = [Request(i, i * 0.01, 40, 40) for i in range(40)]
    recs = ClusterSim(prof, 2, reqs, seed=0, admission=AdmissionSpec(1000, max_outstanding=2)).run(RR(2))
    assert all(r.http_status is None for r in recs)
    events = sorted([(r.dispatch_s, 1) for r in recs] + [(r.finish_s - prof.api_overhead_s, -1) for r in recs])
    in_flight = peak = 0
    for _, d in events:  # at equal times a finish frees its slot before the next dispatch
        in_flight += d
        peak = max(peak, in_flight)
    assert peak <= 4  # 2 instances x max_outstanding 2


def test_a_session_goes_on_after_a_refused_turn():
    prof = tiny_profile()
    reqs = [Request(0, 0.0, 40, 200), Request(1, 0.001, 40, 40, session_id=7, turn=0),
            Request(2, 0.002, 40, 40, session_id=7, turn=1, think_s=0.5)]
    recs = ClusterSim(prof, 1, reqs, seed=0, admission=AdmissionSpec(0, max_outstanding=1)).run(RR(1))
    by = {r.request_id: r for r in recs}
    assert by[1].http_status == 429
    assert by[2].arrival_s >= by[1].dispatch_s + 0.5 - 1e-12
    assert len(recs) == 3


def test_a_clone_holds_its_own_queue():
    prof = tiny_profile()
    sim = ClusterSim(prof, 1, burst(6), seed=0, admission=AdmissionSpec(max_queue=10, max_outstanding=1))
    sim.set_router(RR(1))
    sim.run_until(0.004)
    assert sim.dispatcher.admission.num_held == 4
    fork = sim.clone()
    fork.run_until(100.0)
    assert fork.dispatcher.admission.num_held == 0 and sim.dispatcher.admission.num_held == 4
    assert len(sim.run(RR(1))) == 6 and len(fork.records) == 6
