"""The paper's Table 2 classes: thresholds from the profile, the four orders."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.profiles import Profile
from lbbench.workloads import PAPER_CLASS_ORDERS, WorkloadError, paper_classes
from lbbench.workloads.paper_classes import class_ranges, class_thresholds

PROFILE = Profile(
    name="test-v100", description="", model="", hardware="", base_s=0.01, prefill_token_s=2.5e-4,
    decode_seq_s=1e-4, context_token_s=1e-7, num_kv_blocks=1000, block_size=16, max_num_seqs=128,
    max_num_batched_tokens=4096, max_model_len=4096, chunked_prefill=False, grad1=3.2e-4, grad2=3.3e-5,
    epsilon=0.1, alpha=0.5, min_step_s=0.02)


def test_thresholds_convert_seconds_to_tokens():
    assert class_thresholds(PROFILE) == (2000, 250)
    # 0.5 s is 5000 prompt tokens here, which cannot fit beside a heavy decode in 4096:
    # the threshold falls back to half of what fits, (4096 - 1.5 * 200) // 2
    assert class_thresholds(replace(PROFILE, min_step_s=0.025, prefill_token_s=1e-4)) == (1898, 200)


def _is_heavy_prompt(tokens: int) -> bool:
    return tokens * PROFILE.prefill_token_s >= 0.5 - 1e-12


def _is_heavy_decode(tokens: int) -> bool:
    return tokens * PROFILE.min_step_s >= 5.0 - 1e-12


@settings(max_examples=20, deadline=None)
@given(order=st.sampled_from(PAPER_CLASS_ORDERS), n=st.integers(0, 200), seed=st.integers(0, 2**31))
def test_every_request_is_in_its_class(order, n, seed):
    reqs = paper_classes(order, n, 10.0, seed, PROFILE)
    assert [r.request_id for r in reqs] == list(range(n))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    for r in reqs:
        assert _is_heavy_prompt(r.prompt_tokens) == (r.task[0] == "H")
        assert _is_heavy_decode(r.output_tokens) == (r.task[1] == "H")
        assert r.prompt_tokens + r.output_tokens <= PROFILE.max_model_len
        assert r.prompt_tokens >= 1 and r.output_tokens >= 1


def test_orders():
    n = 3000
    by_order = {o: [r.task for r in paper_classes(o, n, 20.0, 1, PROFILE)] for o in PAPER_CLASS_ORDERS}
    assert set(by_order["lh_hl_random"]) == {"LH", "HL"}
    assert by_order["lh_hl_random"].count("LH") == 1500
    assert {c: by_order["all_random"].count(c) for c in ("LL", "LH", "HL", "HH")} == \
        {"LL": 750, "LH": 750, "HL": 750, "HH": 750}
    assert by_order["lh_then_hl"] == ["LH"] * 1500 + ["HL"] * 1500
    assert by_order["hl_then_lh"] == ["HL"] * 1500 + ["LH"] * 1500
    # the random orders are mixed, not blocks
    switches = sum(a != b for a, b in zip(by_order["lh_hl_random"], by_order["lh_hl_random"][1:]))
    assert switches > 1000


def test_arrivals_identical_across_orders():
    times = {o: [r.arrival_s for r in paper_classes(o, 300, 5.0, 9, PROFILE)] for o in PAPER_CLASS_ORDERS}
    first = times[PAPER_CLASS_ORDERS[0]]
    assert all(t == first for t in times.values())


def test_unknown_order_lists_choices():
    with pytest.raises(WorkloadError, match="lh_hl_random"):
        paper_classes("sorted", 10, 1.0, 0, PROFILE)


def test_small_context_shrinks_the_heavy_prompt_threshold():
    ranges = class_ranges(replace(PROFILE, max_model_len=2048))
    (hp_lo, hp_hi), (hd_lo, hd_hi) = ranges["HH"]
    assert hp_lo == (2048 - 375) // 2 and hp_hi + hd_hi <= 2048


def test_context_too_small_for_heavy_prompt_is_an_error():
    small = replace(PROFILE, max_model_len=376)
    with pytest.raises(WorkloadError, match="max_model_len"):
        class_ranges(small)
