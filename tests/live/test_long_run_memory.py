"""A long run keeps nothing per finished request: the live state, the proxy and the replay stay bounded."""

from __future__ import annotations

from lbbench.core import (
    ClusterState,
    Dispatched,
    Finished,
    FirstToken,
    InstanceSpec,
    Request,
    TokensGenerated,
)


def _stream(state: ClusterState, rid: int, inst: int, t: float, tokens: int = 100) -> None:
    """One live request's events: dispatched, first token, a count per step, finished."""
    req = Request(rid, t, 128, 200)
    state.apply(Dispatched(req, inst, t))
    state.apply(FirstToken(rid, inst, t + 0.01))
    for k in range(2, tokens):
        state.apply(TokensGenerated(rid, inst, t + 0.01 * k, k))


def test_cluster_state_heap_bounded_after_many_finished_live_requests():
    state = ClusterState([InstanceSpec(), InstanceSpec()])
    live: list[tuple[int, int]] = []
    for rid in range(2000):
        inst = rid % 2
        _stream(state, rid, inst, rid * 0.01)
        live.append((rid, inst))
        if len(live) > 20:  # about 20 requests stream at once
            old, oi = live.pop(0)
            state.apply(Finished(old, oi, rid * 0.01 + 1, 100))
        state.view()
    for rid, inst in live:
        state.apply(Finished(rid, inst, 100.0, 100))
    for inst in state._inst:
        assert not inst.entries
        assert len(inst.heap) <= 2 * inst.n_ticking + 64 + 1
    assert not state._where


def test_cluster_state_min_remaining_unchanged_by_compaction():
    state = ClusterState([InstanceSpec()])
    for rid in range(10):
        req = Request(rid, 0.0, 64, 50 + rid)
        state.apply(Dispatched(req, 0, 0.0))
        state.apply(FirstToken(rid, 0, 0.1))
    for step in range(2, 40):
        for rid in range(10):
            state.apply(TokensGenerated(rid, 0, 0.1 * step, step))
        v = state.view().instances[0]
        assert v.min_remaining_tokens == 50 - step  # request 0: expected 50, `step` generated
    assert len(state._inst[0].heap) <= 2 * 10 + 64 + 1
