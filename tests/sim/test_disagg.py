"""Prefill/decode disaggregation on the simulator (``lbbench.sim.disagg``): a hand-computed two-instance case,
transfers serialized on a shared link, a decode instance whose blocks are full (the request waits, never
dropped), role-less records unchanged, the lifecycle invariants of any workload, and a clone with transfers in
flight."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.core import Decision, PairDecision
from lbbench.kv_links import KVLink
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim
from lbbench.sim.disagg import DisaggSim
from factories import req, tiny_profile

LINK = KVLink("test", 1e6, 1e-3)  # 1 MB/s, 1 ms: a 19,000-byte transfer takes 20 ms
BPT = 1000.0  # KV bytes per token


class Pairs:
    """Sends request ``i`` to ``plan[i]``: (decode, prefill or None)."""

    name = "pairs"

    def __init__(self, plan):
        self.plan = plan

    def route(self, queue, view, now_s):
        d, p = self.plan[queue[0].request_id]
        return PairDecision(0, d, p)


def _sim(prof, roles, reqs, **kw):
    return DisaggSim(prof, len(roles), reqs, roles=roles, kv_link=LINK, kv_bytes_per_token=[BPT] * len(roles),
                     check_invariants=True, **kw)


def test_a_request_prefills_moves_and_decodes_by_hand():
    prof = tiny_profile()
    sim = _sim(prof, ["prefill", "decode"], [req(0, 0.0, 20, 5)])
    (rec,) = sim.run(Pairs({0: (1, 0)}))
    t1 = prof.base_s + prof.prefill_token_s * 20  # the prefill step (one token nobody sees)
    ready = t1 + 1e-3 + 19 * BPT / 1e6  # the KV of 19 tokens: all but the prompt's last
    first = ready + prof.base_s + prof.prefill_token_s * 1  # the decode instance computes the last prompt token
    done = first + sum(prof.base_s + prof.decode_seq_s + prof.context_token_s * c for c in (21, 22, 23, 24))
    assert (rec.instance, rec.prefill_instance, rec.error) == (1, 0, None)
    assert rec.prefill_done_s == pytest.approx(t1) and rec.kv_ready_s == pytest.approx(ready)
    assert rec.decode_admit_s == pytest.approx(ready) and rec.transfer_bytes == 19 * BPT
    assert rec.first_token_s == pytest.approx(first) and rec.finish_s == pytest.approx(done)
    assert (rec.output_tokens, rec.generated_tokens, rec.prompt_tokens) == (5, 5, 20)
    assert sim.instances[0].used_blocks == sim.instances[1].used_blocks == 0


def test_transfers_sharing_a_link_are_serialized():
    prof = tiny_profile()
    sim = _sim(prof, ["prefill", "prefill", "decode"], [req(0, 0.0, 20, 3), req(1, 0.0, 20, 3)])
    recs = {r.request_id: r for r in sim.run(Pairs({0: (2, 0), 1: (2, 1)}))}
    t1 = prof.base_s + prof.prefill_token_s * 20
    one = 1e-3 + 19 * BPT / 1e6
    assert recs[0].prefill_done_s == pytest.approx(t1) == recs[1].prefill_done_s
    assert recs[0].kv_ready_s == pytest.approx(t1 + one)
    assert recs[1].kv_ready_s == pytest.approx(t1 + 2 * one)  # the decode instance's link carried one at a time


def test_separate_links_run_side_by_side():
    prof = tiny_profile()
    sim = _sim(prof, ["prefill", "prefill", "decode", "decode"], [req(0, 0.0, 20, 3), req(1, 0.0, 20, 3)])
    recs = {r.request_id: r for r in sim.run(Pairs({0: (2, 0), 1: (3, 1)}))}
    assert recs[0].kv_ready_s == pytest.approx(recs[1].kv_ready_s)


def test_a_transfer_that_does_not_fit_waits_for_blocks_and_is_not_dropped():
    prof = tiny_profile(num_kv_blocks=12, max_model_len=48)
    # request 0 runs whole on the decode instance and holds 11 of its 12 blocks (40 + 4 tokens) for a while;
    # request 1's KV (19 tokens, 5 blocks with its next token) lands meanwhile and must wait for them
    sim = _sim(prof, ["prefill", "decode"], [req(0, 0.0, 40, 4), req(1, 0.0, 20, 3)])
    recs = {r.request_id: r for r in sim.run(Pairs({0: (1, None), 1: (1, 0)}))}
    assert all(r.error is None for r in recs.values()) and len(recs) == 2
    assert recs[0].prefill_instance is None and recs[0].kv_ready_s is None
    assert recs[1].decode_admit_s > recs[1].kv_ready_s
    assert recs[1].decode_admit_s == pytest.approx(recs[0].finish_s)  # the blocks came free at its end


def test_a_fleet_with_roles_but_whole_requests_gives_clusters_records():
    prof = tiny_profile()
    reqs = [req(i, 0.01 * i, 10 + 7 * i % 50, 1 + 5 * i % 30) for i in range(60)]
    plain = ClusterSim(prof, 3, reqs, check_invariants=True).run(get_router("jsq", num_instances=3))
    roles = _sim(prof, ["mixed"] * 3, reqs).run(get_router("jsq", num_instances=3))
    assert roles == plain


workloads = st.lists(st.tuples(st.floats(0, 0.3), st.integers(1, 60), st.integers(1, 40)), min_size=1,
                     max_size=30)


@settings(max_examples=30, deadline=None)
@given(workloads, st.sampled_from(["pd_vllm", "pd_llmd", "pd_dynamo", "pd_joint"]), st.booleans())
def test_every_request_finishes_once_in_stage_order(rows, router, caching):
    prof = tiny_profile(num_kv_blocks=40, max_model_len=120, kv_bytes_per_block=4 * BPT)
    reqs = [req(i, t, p, o) for i, (t, p, o) in enumerate(sorted(rows))]
    sim = _sim(prof, ["prefill", "prefill", "decode", "mixed"], reqs, prefix_caching=caching)
    router_obj = get_router(router, num_instances=4, seed=0, profile=prof, **(
        {"short_prompt_tokens": 8} if router == "pd_joint" else {}))
    recs = sim.run(router_obj)
    assert sorted(r.request_id for r in recs) == list(range(len(reqs)))
    for r in recs:
        assert r.error is None and r.generated_tokens == r.output_tokens
        assert r.instance in (2, 3)
        if r.prefill_instance is not None:
            assert r.prefill_instance in (0, 1)
            assert r.dispatch_s <= r.prefill_done_s <= r.kv_ready_s <= r.decode_admit_s < r.first_token_s
            assert r.transfer_bytes == (r.prompt_tokens - 1) * BPT
        assert r.first_token_s <= r.finish_s
    for inst in sim.instances:
        assert inst.used_blocks == 0 and not inst.reqs
    if router == "pd_joint":  # every pair it committed to a decode instance reached it
        assert router_obj.committed.num_requests == [0] * 4 and not router_obj.committed.decode_of


def test_a_plain_decision_on_a_role_fleet_serves_whole():
    prof = tiny_profile()

    class Whole:
        name = "whole"

        def route(self, queue, view, now_s):
            return Decision(0, 1)

    (rec,) = _sim(prof, ["prefill", "decode"], [req(0, 0.0, 20, 5)]).run(Whole())
    assert rec.prefill_instance is None and rec.instance == 1 and rec.transfer_bytes is None


@pytest.mark.parametrize("at_s, landed", [(0.02, 0), (0.05, 0), (0.3, 4)])
def test_a_clone_taken_with_transfers_in_flight_runs_on_to_the_same_records(at_s, landed):
    prof = tiny_profile(num_kv_blocks=16, max_model_len=60)
    reqs = [req(i, 0.01 * i, 20 + 3 * i, 6 + i) for i in range(12)]
    sim = _sim(prof, ["prefill", "prefill", "decode"], reqs)
    sim.set_router(get_router("pd_vllm", num_instances=3))
    sim.run_until(at_s)
    assert sim._legs and len(sim._landed[2]) == landed  # requests between prefill and decode; KV waiting for blocks
    twin = sim.clone()
    twin.set_router(copy.deepcopy(sim.dispatcher.router))  # a fork keeps the original's router object
    assert twin._legs.keys() == sim._legs.keys()
    assert all(twin._legs[k] is not sim._legs[k] for k in sim._legs)
    twin.run_until(float("inf"))
    sim.run_until(float("inf"))
    assert twin.records == sim.records and len(sim.records) == 12
