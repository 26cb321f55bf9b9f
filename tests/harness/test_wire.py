"""Request bodies, synthetic prompts and the /metrics parser (no servers)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.core import Request
from lbbench.live.http import (DEFAULT_TOKEN_ID_RANGE, PREFIX_BLOCK_TOKENS, StreamResult, prompt_token_ids,
                                  request_body)
from lbbench.engines.vllm.metrics_page import render_metrics
from lbbench.live.metrics import parse_metrics


@settings(max_examples=60, deadline=None)
@given(rid=st.integers(0, 10**9), n=st.integers(0, 3000))
def test_prompt_ids_have_exact_length_in_range_and_are_deterministic(rid, n):
    req = Request(rid, 0.0, n, 1)
    ids = prompt_token_ids(req)
    assert len(ids) == n
    lo, hi = DEFAULT_TOKEN_ID_RANGE
    assert all(lo <= i < hi for i in ids)
    assert ids == prompt_token_ids(req)


def test_prompts_of_different_requests_differ():
    a = prompt_token_ids(Request(1, 0.0, 64, 1))
    b = prompt_token_ids(Request(901, 0.0, 64, 1))
    assert a[:16] != b[:16]


@settings(max_examples=30, deadline=None)
@given(shared=st.lists(st.integers(0, 2**40), min_size=1, max_size=3),
       tail_a=st.integers(0, 2**40), tail_b=st.integers(0, 2**40))
def test_shared_prefix_hashes_share_token_blocks(shared, tail_a, tail_b):
    n = (len(shared) + 1) * PREFIX_BLOCK_TOKENS
    a = prompt_token_ids(Request(1, 0.0, n, 1, prefix_hashes=tuple(shared) + (tail_a,)))
    b = prompt_token_ids(Request(2, 0.0, n, 1, prefix_hashes=tuple(shared) + (tail_b,)))
    k = len(shared) * PREFIX_BLOCK_TOKENS
    assert a[:k] == b[:k]
    assert len(a) == len(b) == n
    if tail_a != tail_b:
        assert a[k:] != b[k:]


def test_request_body_asks_for_exact_lengths():
    body = request_body(Request(3, 0.0, 10, 7), "m")
    assert body["max_tokens"] == body["min_tokens"] == 7 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert len(body["prompt"]) == 10
    text = request_body(Request(3, 0.0, 10, 7, prompt="hello"), "m")
    assert text["prompt"] == "hello"
    chat = request_body(Request(3, 0.0, 10, 7, prompt="hello"), "m", api="chat")
    assert chat["messages"] == [{"role": "user", "content": "hello"}] and "prompt" not in chat


def test_tbt_stats():
    r = StreamResult(actual_send_s=0.0, token_times_s=[1.0, 1.1, 1.3, 1.3])
    mean, p99, mx = r.tbt_stats_s()
    assert abs(mean - 0.1) < 1e-12 and abs(mx - 0.2) < 1e-12 and 0.19 < p99 <= 0.2
    assert StreamResult(0.0, token_times_s=[1.0]).tbt_stats_s() == (None, None, None)


def test_metrics_round_trip_and_vllm_page():
    m = parse_metrics(render_metrics("x", 3, 2, 0.25, 7))
    assert (m.num_running, m.num_waiting, m.kv_usage, m.num_preemptions) == (3, 2, 0.25, 7)
    page = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 4.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0125
vllm:num_preemptions_total{engine="0",model_name="tiny"} 2.0
vllm:num_requests_running_other 99
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="tiny"} 5.0
"""
    m = parse_metrics(page)
    assert (m.num_running, m.num_waiting, m.kv_usage, m.num_preemptions) == (4, 1, 0.0125, 2)
    assert parse_metrics("# nothing here\nfoo 1\n") is None
