"""Flow control (``lbbench.admission``): the specs' parsing and bad input, a hand-computed shedding order with
priority bands and per-tenant shedding, the release order (bands, round robin or fcfs across tenants), and the
dispatcher holding requests while the pool has no room."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.admission import (AdmissionError, AdmissionSpec, FlowController, Tenant, assign_tenants,
                               parse_admission, parse_tenants)
from lbbench.core import ClusterState, Decision, Dispatched, Finished, InstanceSpec, Request
from lbbench.dispatch import Dispatcher


def rq(i: int, tenant: str, band: int = 0) -> Request:
    return Request(i, float(i), 10, 10, tenant=tenant, priority_band=band)


class First:
    name = "first"

    def route(self, queue, view, now_s):
        return Decision(0, 0)


class Least:
    name = "least"

    def route(self, queue, view, now_s):
        return Decision(0, min(range(len(view.instances)), key=lambda i: view.instances[i].num_outstanding))


def test_parse_admission_and_tenants():
    assert parse_admission("max_queue=8") == AdmissionSpec(8, None, "round_robin")
    assert parse_admission("max_queue=0, max_outstanding=4, fairness=fcfs") == AdmissionSpec(0, 4, "fcfs")
    assert parse_tenants("gold:2@0.2,std@0.5,batch:-1") == (Tenant("gold", 2, 0.2), Tenant("std", 0, 0.5),
                                                             Tenant("batch", -1, 1.0))


@pytest.mark.parametrize("text, says", [
    ("max_queue=-1", "admission: max_queue=-1 must be >= 0"),
    ("max_queue=x", "admission: max_queue='x' is not an integer"),
    ("max_outstanding=3", "admission: give max_queue=N"),
    ("max_queue=3,max_outstanding=0", "admission: max_outstanding=0 must be >= 1"),
    ("max_queue=3,fairness=lottery", "admission: fairness='lottery'"),
    ("max_queue=3,depth=2", "admission: unknown key 'depth'"),
])
def test_bad_admission_specs_name_the_field(text, says):
    with pytest.raises(AdmissionError, match="^" + says.replace("(", r"\(").replace("[", r"\[")):
        parse_admission(text)


@pytest.mark.parametrize("text", ["", "a:x", "a@0", "a,a", ":1"])
def test_bad_tenant_specs(text):
    with pytest.raises(AdmissionError, match="^tenants: "):
        parse_tenants(text)


def test_assign_tenants_draws_by_share_keeps_sessions_and_refuses_unknown_tenants():
    tenants = parse_tenants("gold:1@1,std@3")
    reqs = [Request(i, i * 0.1, 10, 10, session_id=i // 4, turn=i % 4) for i in range(400)]
    out = assign_tenants(reqs, tenants, seed=0)
    assert [r.request_id for r in out] == list(range(400))
    assert all((r.tenant == "gold") == (r.priority_band == 1) for r in out)
    for s in range(100):  # a session stays with one tenant
        assert len({r.tenant for r in out if r.session_id == s}) == 1
    gold = sum(r.tenant == "gold" for r in out) / 400
    assert 0.15 < gold < 0.35  # share 1 of 4, over 100 sessions
    assert assign_tenants(reqs, tenants, seed=0) == out  # seeded
    with pytest.raises(AdmissionError, match="^tenants: request 0 names tenant 'nobody'"):
        assign_tenants([Request(0, 0.0, 1, 1, tenant="nobody")], tenants, seed=0)


def test_shedding_order_by_hand():
    # one instance that holds one request (max_outstanding=1) and is busy: nothing is released; max_queue=3
    state = ClusterState([InstanceSpec()])
    disp = Dispatcher(First(), state, admission=FlowController(AdmissionSpec(3, 1), [InstanceSpec()]))
    disp.arrive(Request(0, 0.0, 10, 10))
    assert [r.request_id for r, _ in disp.decide(0.0)] == [0]  # the pool had room for it
    arrivals = [rq(1, "a"), rq(2, "a"), rq(3, "b"), rq(4, "p", 1), rq(5, "b"), rq(6, "p", 1), rq(7, "a")]
    shed = []
    for r in arrivals:
        disp.arrive(r)
        shed += [(s.request_id, status) for s, status in disp.shed]
        disp.shed.clear()
    # r4 (band 1) overfills: band 0's fullest tenant a sheds its newest, r2 (503, displaced)
    # r5 (b): band 0 holds a=[1], b=[3, 5]: b is fullest, its newest is r5 itself (429)
    # r6 (band 1): a=[1], b=[3] tie on count; b's newest came last: r3 (503)
    # r7 (a): a=[1, 7] fullest: r7 itself (429)
    assert shed == [(2, 503), (5, 429), (3, 503), (7, 429)]
    assert disp.waiting == 3 and len(disp) == 0
    assert disp.decide(1.0) == []  # the instance is still at its limit
    disp.observe(Finished(0, 0, 2.0, 10))  # room for one
    assert [r.request_id for r, _ in disp.decide(2.0)] == [4]  # the highest band first
    disp.observe(Finished(4, 0, 3.0, 10))
    disp.observe(Finished(1, 0, 3.0, 10))  # (never sent: a no-op)
    assert [r.request_id for r, _ in disp.decide(3.0)] == [6]
    disp.observe(Finished(6, 0, 4.0, 10))
    assert [r.request_id for r, _ in disp.decide(4.0)] == [1]
    assert disp.waiting == 0
    assert (disp.admission.num_rejected, disp.admission.num_evicted) == (2, 2)


@pytest.mark.parametrize("fairness, order", [("round_robin", [1, 4, 5, 2, 6, 3]), ("fcfs", [1, 2, 3, 4, 5, 6])])
def test_release_order_inside_a_band(fairness, order):
    fc = FlowController(AdmissionSpec(100, 1, fairness), [InstanceSpec()])
    for r in (rq(1, "a"), rq(2, "a"), rq(3, "a"), rq(4, "b"), rq(5, "c"), rq(6, "c")):
        fc.hold(r)
    assert [r.request_id for r in fc.release(10)] == order


def test_room_counts_free_slots_on_healthy_instances_less_the_router_queue():
    specs = [InstanceSpec(max_num_seqs=4), InstanceSpec(max_num_seqs=2)]
    state = ClusterState(specs)
    fc = FlowController(AdmissionSpec(10), specs)  # limits: each instance's max_num_seqs
    state.apply(Dispatched(Request(0, 0.0, 1, 1), 0, 0.0))
    assert fc.room(state.view(), 0) == 3 + 2
    assert fc.room(state.view(), 4) == 1


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 5), st.integers(1, 3),
       st.lists(st.tuples(st.sampled_from(["arrive", "finish"]), st.sampled_from(["a", "b", "c"]),
                          st.integers(-1, 1)), min_size=1, max_size=60))
def test_every_request_is_held_dispatched_or_shed_exactly_once(max_queue, limit, ops):
    state = ClusterState([InstanceSpec()] * 2)
    disp = Dispatcher(Least(), state, admission=FlowController(AdmissionSpec(max_queue, limit), [InstanceSpec()] * 2))
    sent, shed, in_flight = [], [], []
    for k, (op, tenant, band) in enumerate(ops):
        now = float(k)
        if op == "arrive":
            r = Request(k, now, 10, 10, tenant=tenant, priority_band=band)
            held_bands = [b for b, bd in disp.admission._bands.items() if bd.num_held]
            disp.arrive(r)
            for victim, status in disp.shed:
                # the victim is from the lowest band held, the arriving request included
                assert victim.priority_band == min([*held_bands, band])
                assert status == (429 if victim is r else 503)
            shed += [v.request_id for v, _ in disp.shed]
            disp.shed.clear()
        elif in_flight:
            rid = in_flight.pop(0)
            disp.observe(Finished(rid, state.instance_of(rid), now, 10))
        out = disp.decide(now)
        sent += [r.request_id for r, _ in out]
        in_flight += [r.request_id for r, _ in out]
        assert disp.admission.num_held <= max_queue
        # a router that fills free slots never exceeds the pool's limit (the gate is pool-wide; the router chooses)
        assert sum(iv.num_outstanding for iv in state.view().instances) <= 2 * limit
    held = [r.request_id for b in disp.admission._bands.values() for f in b.flows.values() for _, r in f]
    arrived = [k for k, (op, _, _) in enumerate(ops) if op == "arrive"]
    assert sorted(sent + shed + held) == arrived
