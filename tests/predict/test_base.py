"""Predictor interface, bucket schemes and the reference predictors."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.core import Request
from lbbench.predict import (
    BucketOraclePredictor,
    BucketScheme,
    NoisyPredictor,
    OraclePredictor,
    Prediction,
    Predictor,
    PredictorSpecError,
    annotate,
    equal_width_scheme,
    get_scheme,
    load_predictor,
    paper_scheme,
)


@dataclass
class FakeProfile:
    decode_tokens_per_s: float
    max_model_len: int


def _reqs(lengths):
    return [Request(i, float(i), 10, n) for i, n in enumerate(lengths)]


def test_paper_scheme_default_is_geometric_x4_from_half_a_second():
    s = paper_scheme()
    # 50 tokens/s: 0.5 s, 2 s, 8 s, 32 s; 128 s = 6400 tokens > the 4096 cap
    assert s.edges_tokens == (25, 100, 400, 1600)
    assert s.cap_tokens == 4096
    assert s.num_buckets == 5


def test_paper_scheme_uses_profile_rate_and_cap():
    s = paper_scheme(FakeProfile(decode_tokens_per_s=100.0, max_model_len=2048))
    assert s.edges_tokens == (50, 200, 800)
    assert s.upper_bound(3) == 2048


def test_equal250_scheme():
    s = get_scheme("equal250", FakeProfile(50.0, 1000))
    assert s.edges_tokens == (250, 500, 750)
    assert [s.bucket_of(t) for t in (0, 249, 250, 999, 5000)] == [0, 0, 1, 3, 3]
    assert s.expected(0) == 125 and s.expected(3) == 875
    assert equal_width_scheme(width_tokens=100, cap_tokens=300).edges_tokens == (100, 200)


@given(st.integers(min_value=0, max_value=10_000))
def test_bucket_bounds_contain_tokens(tokens):
    for s in (paper_scheme(), get_scheme("equal250")):
        b = s.bucket_of(tokens)
        assert s.lower_bound(b) <= tokens
        assert tokens < s.upper_bound(b) or b == s.num_buckets - 1
        assert s.lower_bound(b) <= s.expected(b) <= s.upper_bound(b)


def test_scheme_roundtrip_and_validation():
    s = paper_scheme()
    assert BucketScheme.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError):
        BucketScheme("bad", (10, 5), 100)
    with pytest.raises(ValueError):
        BucketScheme("bad", (10, 50), 50)
    with pytest.raises(IndexError):
        s.upper_bound(s.num_buckets)


def test_oracles():
    s = paper_scheme()
    reqs = _reqs([3, 30, 3000])
    assert OraclePredictor(s).predict(reqs) == [Prediction(0, 3, 3, 3), Prediction(1, 30, 30, 30),
                                                Prediction(4, 3000, 3000, 3000)]
    assert BucketOraclePredictor(s).predict(reqs) == [Prediction(0, 25, 25, 25), Prediction(1, 100, 100, 100),
                                                       Prediction(4, 4096, 4096, 4096)]
    # a prediction without a distribution reads its quantiles as the point estimate
    assert (Prediction(2, 150).p50, Prediction(2, 150).p90, Prediction(2, 150, 120, 300).p90) == (150, 150, 300)
    assert isinstance(OraclePredictor(s), Predictor)


def test_load_predictor_specs():
    assert load_predictor("oracle").name == "oracle"
    assert load_predictor("bucket_oracle", scheme="equal250").scheme.name == "equal250"
    p = load_predictor("noisy:0.8", seed=3)
    assert isinstance(p, NoisyPredictor) and p.accuracy == 0.8 and p.seed == 3
    for bad in ("nope", "noisy:x", "noisy:1.5", "text:", "oracle:3", "", "text:d?colour=red", "text:d?model"):
        with pytest.raises(PredictorSpecError, match="^predictor"):
            load_predictor(bad)


def test_annotate_fills_predictions_in_order():
    reqs = _reqs(list(range(0, 3000, 7)))
    out = annotate(reqs, OraclePredictor(paper_scheme()), batch_size=16)
    assert [r.request_id for r in out] == [r.request_id for r in reqs]
    assert all(r.predicted_output_tokens == r.output_tokens for r in out)
    assert all(r.predicted_bucket == paper_scheme().bucket_of(r.output_tokens) for r in out)
    assert reqs[0].predicted_bucket is None  # originals untouched


def test_noisy_is_deterministic_and_order_independent():
    reqs = _reqs([i % 2000 for i in range(500)])
    p = NoisyPredictor(paper_scheme(), 0.5, seed=1)
    a = p.predict(reqs)
    b = p.predict(reqs[::-1])[::-1]
    assert a == b
    assert NoisyPredictor(paper_scheme(), 0.5, seed=2).predict(reqs) != a


@settings(max_examples=25, deadline=None)
@given(acc=st.floats(min_value=0.0, max_value=1.0), seed=st.integers(0, 1000))
def test_noisy_confusion_rate_matches_accuracy(acc, seed):
    s = paper_scheme()
    n = 2000
    reqs = [Request(i, 0.0, 10, [10, 50, 200, 800, 2000][i % 5]) for i in range(n)]
    preds = NoisyPredictor(s, acc, seed).predict(reqs)
    kept = sum(p.bucket == s.bucket_of(r.output_tokens) for p, r in zip(preds, reqs))
    # binomial: 4.5 standard deviations
    assert abs(kept / n - acc) <= 4.5 * (acc * (1 - acc) / n) ** 0.5 + 1e-9
    for p, r in zip(preds, reqs):
        tb = s.bucket_of(r.output_tokens)
        assert 0 <= p.bucket < s.num_buckets and abs(p.bucket - tb) <= 2
        assert p.expected_tokens == s.upper_bound(p.bucket)


def test_noisy_mislabels_mostly_to_adjacent_buckets():
    s = get_scheme("equal250")
    reqs = [Request(i, 0.0, 10, 1000) for i in range(4000)]  # bucket 4, interior
    preds = NoisyPredictor(s, 0.0, 0).predict(reqs)
    dist = [abs(p.bucket - 4) for p in preds]
    assert dist.count(0) == 0
    assert dist.count(1) > 3 * dist.count(2) > 0
