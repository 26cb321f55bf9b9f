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
