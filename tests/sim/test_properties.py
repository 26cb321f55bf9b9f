"""Hypothesis properties of the simulator: every request finishes exactly once, times
are monotone, no token is generated twice, invariants hold every step, and the
skip-ahead fast path gives the same result as stepping every token."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbbench.core import Decision
from lbbench.sim.cluster import ClusterSim
from factories import req, tiny_profile


class RR:
    name = "round_robin"

    def __init__(self, n):
        self.n, self.i = n, -1

    def route(self, queue, view, now_s):
        self.i = (self.i + 1) % self.n
        return Decision(0, self.i)


workloads = st.lists(
    st.tuples(st.floats(0, 0.5), st.integers(1, 60), st.integers(1, 80)), min_size=1, max_size=40)


def build(items):
    t = 0.0
    out = []
    for i, (gap, p, o) in enumerate(items):
        t += gap
        out.append(req(i, t, p, o))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=workloads, n_inst=st.integers(1, 3), chunked=st.booleans(),
       blocks=st.integers(40, 120), sched=st.sampled_from(["fcfs", "bin_packing", "least_work_left"]),
       engine=st.sampled_from(["v1", "v0"]))
def test_every_request_finishes_once_with_monotone_times(items, n_inst, chunked, blocks, sched, engine):
    prof = tiny_profile(num_kv_blocks=blocks, chunked_prefill=chunked, max_model_len=140, scheduler=engine)
    reqs = build(items)
    sim = ClusterSim(prof, n_inst, reqs, instance_scheduler=sched, check_invariants=True)
    recs = sim.run(RR(n_inst))
    assert sorted(r.request_id for r in recs) == [r.request_id for r in reqs]
    for r in recs:
        assert r.error is None
        assert r.arrival_s <= r.dispatch_s <= r.first_token_s <= r.finish_s
        assert r.generated_tokens == r.output_tokens
        if r.output_tokens > 1:
            assert r.tbt_mean_s > 0 and r.tbt_max_s >= r.tbt_p99_s >= 0
    for inst in sim.instances:
        assert inst.used_blocks == 0 and not inst.running and not inst.waiting


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=workloads, chunked=st.booleans(), blocks=st.integers(40, 120), engine=st.sampled_from(["v1", "v0"]))
def test_token_times_strictly_increase(items, chunked, blocks, engine):
    prof = tiny_profile(num_kv_blocks=blocks, chunked_prefill=chunked, max_model_len=140, scheduler=engine)
    sim = ClusterSim(prof, 1, build(items))
    seen = []
    inst = sim.instances[0]
    orig = inst._on_finish

    def hook(r):
        t = inst.token_times(r)
        seen.append((len(t), r.output_tokens))
        assert np.all(np.diff(t) > 0), "a token time repeats: a token was generated twice"
        orig(r)
    inst._on_finish = hook
    sim.run(RR(1))
    assert all(n == out for n, out in seen)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=workloads, n_inst=st.integers(1, 2), chunked=st.booleans(), blocks=st.integers(40, 120),
       engine=st.sampled_from(["v1", "v0"]))
def test_skip_ahead_matches_step_by_step(items, n_inst, chunked, blocks, engine):
    prof = tiny_profile(num_kv_blocks=blocks, chunked_prefill=chunked, max_model_len=140, scheduler=engine)
    reqs = build(items)
    fast = ClusterSim(prof, n_inst, reqs).run(RR(n_inst))
    slow = ClusterSim(prof, n_inst, reqs, skip_ahead=False).run(RR(n_inst))
    key = lambda r: r.request_id  # noqa: E731
    for a, b in zip(sorted(fast, key=key), sorted(slow, key=key)):
        assert a.instance == b.instance and a.num_preemptions == b.num_preemptions
        assert np.isclose(a.first_token_s, b.first_token_s, rtol=1e-9, atol=1e-9)
        assert np.isclose(a.finish_s, b.finish_s, rtol=1e-9, atol=1e-9)
