"""ClusterState: O(1) aggregates agree with a recount from per-request detail."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench import core
from lbbench.core import (ClusterState, Dispatched, Finished, FirstToken, InstanceSpec, Preempted,
                          StepsAdvanced, TokensGenerated, bucket_of)
from factories import req


def test_bucket_of():
    assert [bucket_of(t, (256, 2048)) for t in (0, 255, 256, 2047, 2048, 10**6)] == [0, 0, 1, 1, 2, 2]


ops = st.lists(st.tuples(st.sampled_from(["dispatch", "first", "steps", "tokens", "preempt", "finish"]),
                         st.integers(0, 7), st.integers(0, 1), st.integers(1, 5)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(ops=ops)
def test_aggregates_match_detail(ops):
    st_ = ClusterState([InstanceSpec(), InstanceSpec()])
    where = {}
    t = 0.0
    for kind, rid, inst, k in ops:
        t += 0.01
        if kind == "dispatch" and rid not in where:
            st_.apply(Dispatched(req(rid, t, 10 + rid, 20 + 3 * rid), inst, t))
            where[rid] = inst
        elif rid in where:
            i = where[rid]
            if kind == "first":
                st_.apply(FirstToken(rid, i, t))
            elif kind == "steps":
                st_.apply(StepsAdvanced(i, t, k))
            elif kind == "tokens":
                st_.apply(TokensGenerated(rid, i, t, st_.generated_tokens(rid) + k))
            elif kind == "preempt":
                st_.apply(Preempted(rid, i, t))
            elif kind == "finish":
                st_.apply(Finished(rid, i, t, 1))
                del where[rid]
    view = st_.view(detail=True)
    for iv in view.instances:
        rows = iv.outstanding
        assert iv.num_outstanding == len(rows)
        decoding = [r for r in rows if r.first_token_s is not None]
        assert iv.num_decoding == len(decoding)
        assert iv.prompt_tokens_pending == sum(r.request.prompt_tokens for r in rows if r.first_token_s is None)
        gen = sum(r.generated_tokens for r in rows)
        assert iv.context_tokens == sum(r.request.prompt_tokens for r in decoding) + gen
        assert iv.predicted_tokens_remaining == sum(r.request.output_tokens for r in rows) - gen
        if iv.min_remaining_tokens is not None:
            assert iv.min_remaining_tokens == min(r.request.output_tokens - r.generated_tokens for r in decoding)
        else:
            assert not decoding
        assert sum(iv.decode_bucket_counts) == len(rows) == sum(iv.prompt_bucket_counts)


def test_generated_tokens_follow_the_step_clock():
    s = ClusterState([InstanceSpec()])
    s.apply(Dispatched(req(1, 0.0, 5, 10), 0, 0.0))
    s.apply(StepsAdvanced(0, 0.1, 1))
    s.apply(FirstToken(1, 0, 0.1))
    assert s.generated_tokens(1) == 1
    s.apply(StepsAdvanced(0, 0.2, 4))
    assert s.generated_tokens(1) == 5
    s.apply(Preempted(1, 0, 0.2))
    s.apply(StepsAdvanced(0, 0.3, 3))
    assert s.generated_tokens(1) == 5  # frozen while preempted
    v = s.view().instances[0]
    assert v.num_prefilling == 1 and v.prompt_tokens_pending == 5


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("slack", [0, 3])
def test_the_finish_heap_keeps_every_live_key_within_its_bound(seed, slack, monkeypatch):
    """With a small slack the heap is rebuilt often (from the entries or from the heap itself, whichever is
    shorter): after every event it holds at most ``2 * ticking + slack`` keys, every ticking request's current
    key among them, and the minimum the views report is the detail's."""
    monkeypatch.setattr(core, "_HEAP_SLACK", slack)
    rng = np.random.default_rng(seed)
    kinds = ["dispatch", "first", "steps", "tokens", "preempt", "finish", "view"]
    s = ClusterState([InstanceSpec(), InstanceSpec()])
    where: dict[int, int] = {}
    t = 0.0
    for _ in range(600):
        kind = kinds[rng.choice(len(kinds), p=[0.2, 0.15, 0.1, 0.35, 0.05, 0.08, 0.07])]
        rid, inst, k = int(rng.integers(0, 24)), int(rng.integers(0, 2)), int(rng.integers(1, 6))
        t += 0.01
        if kind == "view":
            s.view()
        elif kind == "dispatch" and rid not in where:
            s.apply(Dispatched(req(rid, t, 10 + rid, 20 + 3 * rid), inst, t))
            where[rid] = inst
        elif rid in where:
            i = where[rid]
            if kind == "first":
                s.apply(FirstToken(rid, i, t))
            elif kind == "steps":
                s.apply(StepsAdvanced(i, t, k))
            elif kind == "tokens":
                s.apply(TokensGenerated(rid, i, t, s.generated_tokens(rid) + k))
            elif kind == "preempt":
                s.apply(Preempted(rid, i, t))
            elif kind == "finish":
                s.apply(Finished(rid, i, t, 1))
                del where[rid]
        for si in s._inst:
            assert len(si.heap) <= 2 * si.n_ticking + slack
            assert {(e.expected - e.fixed + e.base, r) for r, e in si.entries.items() if e.ticking} <= set(si.heap)
        if kind == "view":
            for iv in s.view(detail=True).instances:
                decoding = [r for r in iv.outstanding if r.first_token_s is not None]
                want = min((r.request.expected_output_tokens - r.generated_tokens for r in decoding), default=None)
                assert iv.min_remaining_tokens == want
