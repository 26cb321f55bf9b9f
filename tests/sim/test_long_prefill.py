"""vLLM's --long-prefill-token-threshold: with chunked prefill, a request prefills at most that many tokens a step."""

from __future__ import annotations

import pytest

from lbbench.sim.cluster import ClusterSim
from lbbench.routers import get_router

from factories import req, tiny_profile


def _first_token_s(threshold: int) -> float:
    # base 10 ms, 0.1 ms per prefill token, budget 1,024 tokens: an 800-token prompt alone
    prof = tiny_profile(chunked_prefill=True, max_num_batched_tokens=1024, max_model_len=1200, num_kv_blocks=400,
                        long_prefill_token_threshold=threshold)
    recs = ClusterSim(prof, 1, [req(0, 0.0, 800, 4)], check_invariants=True).run(
        get_router("round_robin", num_instances=1, profile=prof))
    return recs[0].first_token_s


def test_threshold_splits_the_prompt_into_capped_chunks():
    # no cap: one step of 800 tokens = 10 ms + 800 x 0.1 ms = 90 ms
    assert _first_token_s(0) == pytest.approx(0.090)
    # cap 256: chunks 256, 256, 256, 32 in four steps = 4 x 10 ms + 800 x 0.1 ms = 120 ms
    assert _first_token_s(256) == pytest.approx(0.120)


def test_async_scheduling_admits_an_arrival_one_step_later():
    # decode steps of 10 ms + 0.1 ms per sequence; request 0 decodes alone from t = 0; request 1 (a 10-token
    # prompt) arrives 5 ms into the step that ends at 0.0201 s (request 0's second step)
    def second_first_token(async_on: bool) -> float:
        prof = tiny_profile(chunked_prefill=True, max_num_batched_tokens=1024, max_model_len=1200,
                            num_kv_blocks=400, async_scheduling=async_on)
        reqs = [req(0, 0.0, 10, 50), req(1, 0.0151, 10, 4)]
        recs = ClusterSim(prof, 1, reqs, check_invariants=True).run(
            get_router("round_robin", num_instances=1, profile=prof))
        return {r.request_id: r for r in recs}[1].first_token_s
    # steps: prefill of request 0 ends at 10 ms + 10 x 0.1 ms = 0.011; decode steps of 10.1 ms end at 0.0211,
    # 0.0312, ... Sync: request 1 joins the step after the one in progress (0.0211 -> 0.0312 plus its 10-token
    # prefill: 0.0211 + 10.1 ms + 1 ms = 0.0322). Async: one step later (0.0312 + 10.2 ms ... )
    sync_t, async_t = second_first_token(False), second_first_token(True)
    assert sync_t == pytest.approx(0.0211 + 0.0101 + 0.0010 + 0.0001, abs=2e-4)
    assert async_t - sync_t == pytest.approx(0.0101, abs=2e-4)
