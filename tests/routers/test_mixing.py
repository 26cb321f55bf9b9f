"""The workload impact estimator against hand-computed values and invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbbench.core import ClusterState, Dispatched, FirstToken, InstanceSpec, Request, StepsAdvanced
from lbbench.routers.mixing import (
    MixingParams,
    decode_interference_s,
    guidance_gap,
    kv_tokens_held,
    least_impact_instance,
    mixing_impact_s,
    paper_decode_reward,
    paper_prefill_reward,
    paper_prefill_time_s,
    paper_r_mix,
    penalties,
    prefill_interference_s,
    r_mixing,
)

V100 = MixingParams(grad1=3.2e-4, grad2=3.3e-5, epsilon=0.01, alpha=0.5)


def test_prefill_interference_hand_computed():
    # 3 co-runners, 1000 prompt tokens still pending there, new prompt of 500:
    # 3.2e-4 * (3*500 + 1000) = 0.8 s
    assert prefill_interference_s(V100, 3, 1000, 500) == pytest.approx(0.8)


def test_decode_interference_hand_computed():
    # shared decode tokens = min(3*200, 400) = 400 -> 3.3e-5 * 2 * 400 = 0.0264 s
    assert decode_interference_s(V100, 3, 400, 200) == pytest.approx(0.0264)
    # co-runners have plenty left: shared = 3*200 = 600 -> 0.0396 s
    assert decode_interference_s(V100, 3, 10_000, 200) == pytest.approx(0.0396)


def test_impact_and_threshold_hand_computed():
    kw = dict(num_running=3, pending_prompt_tokens=1000, remaining_decode_tokens=400,
              prompt_tokens=500, decode_tokens=200)
    # 0.5 * 0.8 + 0.5 * 0.0264 = 0.4132
    assert mixing_impact_s(V100, **kw) == pytest.approx(0.4132)
    assert r_mixing(V100, **kw) == pytest.approx(0.4132)
    # alpha = 1 keeps only prefill, alpha = 0 only decode
    assert mixing_impact_s(MixingParams(3.2e-4, 3.3e-5, 0.0, 1.0), **kw) == pytest.approx(0.8)
    assert mixing_impact_s(MixingParams(3.2e-4, 3.3e-5, 0.0, 0.0), **kw) == pytest.approx(0.0264)
    # below epsilon -> ignored
    small = dict(num_running=1, pending_prompt_tokens=0, remaining_decode_tokens=10,
                 prompt_tokens=20, decode_tokens=10)
    # 0.5*3.2e-4*20 + 0.5*3.3e-5*2*10 = 0.0032 + 0.00033 = 0.00353 < 0.01
    assert mixing_impact_s(V100, **small) == pytest.approx(0.00353)
    assert r_mixing(V100, **small) == 0.0


def test_empty_instance_has_no_impact():
    assert r_mixing(V100, num_running=0, pending_prompt_tokens=0, remaining_decode_tokens=0,
                    prompt_tokens=4000, decode_tokens=4000) == 0.0


def test_from_profile_and_validation():
    class P:
        grad1, grad2, epsilon, alpha = 3.2e-4, 3.3e-5, 0.05, 0.5

    assert MixingParams.from_profile(P()) == MixingParams(3.2e-4, 3.3e-5, 0.05, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        MixingParams(1e-4, 1e-5, 0.0, 1.5)
    with pytest.raises(ValueError, match="grad1"):
        MixingParams(-1e-4, 1e-5, 0.0, 0.5)


def _req(rid: int, p: int, d: int) -> Request:
    return Request(rid, 0.0, p, d)


def _two_request_view():
    """Three instances: 0 holds one request still to prefill (prompt 1000, 300 decode left, so it holds 1000
    KV tokens); 1 holds one decoding request (prompt 100, 50 of 300 generated: 250 left, context 150); 2 is
    empty."""
    state = ClusterState([InstanceSpec()] * 3)
    state.apply(Dispatched(_req(1, 1000, 300), 0, 0.0))
    state.apply(Dispatched(_req(2, 100, 300), 1, 0.0))
    state.apply(FirstToken(2, 1, 0.1))
    state.apply(StepsAdvanced(1, 0.5, 49))
    return state.view()


def test_penalties_from_cluster_view():
    view = _two_request_view()
    assert view.instances[1].predicted_tokens_remaining == 250
    pens = penalties(V100, view, _req(9, 200, 100), estimator="interference")
    # inst 0: 0.5*3.2e-4*(200+1000) + 0.5*3.3e-5*2*min(100,300) = 0.192 + 0.0033
    assert pens[0] == pytest.approx(0.1953)
    # inst 1: 0.5*3.2e-4*200 + 0.5*3.3e-5*2*100 = 0.032 + 0.0033
    assert pens[1] == pytest.approx(0.0353)
    assert pens[2] == 0.0
    assert least_impact_instance(pens) == 2
    assert guidance_gap(pens, 2) == 0.0
    assert guidance_gap(pens, 0) == pytest.approx(0.1953)
    assert guidance_gap(pens, 0, candidates=[0, 1]) == pytest.approx(0.16)


# ---- the paper's estimator (the default), against values worked out by hand

PAPER = MixingParams(grad1=3.2e-4, grad2=3.3e-5, epsilon=0.05, alpha=0.5)


def test_paper_prefill_time_hand_computed():
    # p_i = 10, instance holds 1000 tokens: 3.2e-4 * (100 + 1000) = 0.352 s
    assert paper_prefill_time_s(PAPER, 10, 1000) == pytest.approx(0.352)
    # empty instance, p_i = 5: 3.2e-4 * 25 = 0.008 s (under epsilon)
    assert paper_prefill_time_s(PAPER, 5, 0) == pytest.approx(0.008)


def test_paper_prefill_reward_threshold_hand_computed():
    # above epsilon: 1 - 0.352 / 0.05 = -6.04
    assert paper_prefill_reward(PAPER, 0.352) == pytest.approx(-6.04)
    # at or below epsilon: 0
    assert paper_prefill_reward(PAPER, 0.008) == 0.0
    assert paper_prefill_reward(PAPER, 0.05) == 0.0
    # epsilon = 0: no threshold, r_p = -T_p
    assert paper_prefill_reward(MixingParams(3.2e-4, 3.3e-5, 0.0, 0.5), 0.352) == pytest.approx(-0.352)


def test_paper_decode_reward_hand_computed():
    # -3.3e-5 * (1000 + 10 + 200) = -0.03993
    assert paper_decode_reward(PAPER, 1000, 10, 200) == pytest.approx(-0.03993)


def test_paper_r_mix_hand_computed():
    # 0.5 * (-6.04) + 0.5 * (-0.03993) = -3.039965
    assert paper_r_mix(PAPER, held_tokens=1000, prompt_tokens=10, decode_tokens=200) == pytest.approx(
        -3.039965)
    # empty instance, short prompt: only the decode term, 0.5 * -3.3e-5 * 205 = -0.0033825
    assert paper_r_mix(PAPER, held_tokens=0, prompt_tokens=5, decode_tokens=200) == pytest.approx(
        -0.0033825)
    # alpha = 1: prefill only; alpha = 0: decode only
    a1 = MixingParams(3.2e-4, 3.3e-5, 0.05, 1.0)
    a0 = MixingParams(3.2e-4, 3.3e-5, 0.05, 0.0)
    assert paper_r_mix(a1, held_tokens=1000, prompt_tokens=10, decode_tokens=200) == pytest.approx(-6.04)
    assert paper_r_mix(a0, held_tokens=1000, prompt_tokens=10, decode_tokens=200) == pytest.approx(-0.03993)


def test_paper_penalties_read_the_kv_held_from_the_view():
    view = _two_request_view()
    assert [kv_tokens_held(iv) for iv in view.instances] == [1000, 150, 0]
    pens = penalties(PAPER, view, _req(9, 10, 200))  # the default estimator is the paper's
    # inst 0: -r_mix = 3.039965 (hand-computed above)
    assert pens[0] == pytest.approx(3.039965)
    # inst 1: T_p = 3.2e-4*(100+150) = 0.08 -> r_p = 1 - 1.6 = -0.6;
    #         r_d = -3.3e-5*(150+210) = -0.01188; -r_mix = 0.3 + 0.00594 = 0.30594
    assert pens[1] == pytest.approx(0.30594)
    # inst 2: T_p = 0.032 < epsilon -> r_p = 0; r_d = -3.3e-5*210 -> 0.003465
    assert pens[2] == pytest.approx(0.003465)
    assert least_impact_instance(pens) == 2
    assert guidance_gap(pens, 1) == pytest.approx(0.302475)
    with pytest.raises(ValueError, match="estimator"):
        penalties(PAPER, view, _req(9, 10, 200), estimator="nope")


@given(st.integers(0, 4096), st.integers(0, 20_000), st.integers(0, 4096), st.integers(0, 20_000))
def test_paper_r_mix_nonpositive_and_monotone_in_kv_held(p, held, d, extra):
    r = paper_r_mix(PAPER, held_tokens=held, prompt_tokens=p, decode_tokens=d)
    assert r <= 0.0 and math.isfinite(r)
    assert paper_r_mix(PAPER, held_tokens=held + extra, prompt_tokens=p, decode_tokens=d) <= r + 1e-12


counts = st.integers(0, 300)
tokens = st.integers(0, 8192)


@given(counts, tokens, tokens, tokens, tokens, tokens)
def test_impact_monotone_and_nonnegative(n, pp, dd, p, d, extra):
    kw = dict(num_running=n, pending_prompt_tokens=pp, remaining_decode_tokens=dd,
              prompt_tokens=p, decode_tokens=d)
    base = mixing_impact_s(V100, **kw)
    assert base >= 0.0 and math.isfinite(base)
    # more pending prompt, more decode left, longer request, more co-runners: never less impact
    for key in ("pending_prompt_tokens", "remaining_decode_tokens", "prompt_tokens",
                "decode_tokens", "num_running"):
        bigger = dict(kw, **{key: kw[key] + extra})
        assert mixing_impact_s(V100, **bigger) >= base - 1e-12
    pen = r_mixing(V100, **kw)
    assert pen == 0.0 or pen >= V100.epsilon


@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=8), st.data())
def test_guidance_gap_is_zero_only_at_least_impact(pens, data):
    chosen = data.draw(st.integers(0, len(pens) - 1))
    h = guidance_gap(pens, chosen)
    assert h >= 0.0
    assert (h == 0.0) == (pens[chosen] == min(pens))
    assert guidance_gap(pens, least_impact_instance(pens)) == 0.0
