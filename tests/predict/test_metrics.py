"""Metrics and baselines."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lbbench.predict.metrics import LengthBaseline, accuracy, bucket_metrics, majority_bucket


def test_bucket_metrics():
    m = bucket_metrics([0, 0, 1, 2], [0, 1, 1, 1], 3)
    assert m["accuracy"] == 0.5
    assert m["confusion"] == [[1, 1, 0], [0, 1, 0], [0, 1, 0]]
    pb = m["per_bucket"]
    assert pb[0]["precision"] == 1.0 and pb[0]["recall"] == 0.5
    assert pb[1]["precision"] == 1 / 3 and pb[2]["precision"] is None and pb[2]["recall"] == 0.0


def test_majority_ties_pick_lowest():
    assert majority_bucket([2, 1, 2, 1]) == 1
    assert majority_bucket([]) == 0


def test_length_baseline_learns_a_threshold():
    xs = list(range(100))
    ys = [0 if x < 50 else 3 for x in xs]
    b = LengthBaseline.fit(xs, ys)
    assert accuracy(ys, b.predict(xs)) == 1.0
    assert LengthBaseline.from_dict(b.to_dict()) == b


@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 4)), min_size=1, max_size=200))
def test_length_baseline_predicts_seen_buckets(rows):
    xs, ys = zip(*rows)
    b = LengthBaseline.fit(xs, ys)
    assert set(b.predict(list(xs) + [0, 10**6])) <= set(ys)
    # never worse than the majority bucket on its own training data
    assert accuracy(ys, b.predict(xs)) >= accuracy(ys, [majority_bucket(ys)] * len(ys)) - 1e-9


# --------------------------------------------------------------------------- ranking and calibration

import math  # noqa: E402

import pytest  # noqa: E402

from lbbench.predict.metrics import average_ranks, coverage, kendall_tau, mae, spearman_rho  # noqa: E402


def test_kendall_tau_hand_computed():
    # 6 pairs: 5 concordant, 1 discordant -> (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # tau-b with a tie in x: pairs (0,1) tied in x, (0,2) and (1,2) concordant
    # -> 2 / sqrt((3 - 1) * (3 - 0))
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3])) and math.isnan(kendall_tau([1], [2]))


def test_spearman_rho_hand_computed():
    # ranks equal the values; d = (0, 1, 1, 0): 1 - 6 * 2 / (4 * 15)
    assert spearman_rho([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert average_ranks([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]
    # with ties: ranks x (1.5, 1.5, 3), y (1, 2, 3) -> Pearson of those
    assert spearman_rho([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254, abs=1e-6)


def test_mae_and_coverage_hand_computed():
    assert mae([10, 20, 30], [12, 20, 25]) == pytest.approx(7 / 3)
    assert coverage([1, 5, 10], [2, 5, 9]) == pytest.approx(2 / 3)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=2, max_size=60))
def test_rank_correlations_are_bounded_symmetric_and_monotone_invariant(rows):
    x, y = [a for a, _ in rows], [b for _, b in rows]
    t, r = kendall_tau(x, y), spearman_rho(x, y)
    if math.isnan(t):
        assert len(set(x)) == 1 or len(set(y)) == 1
        return
    assert -1 - 1e-9 <= t <= 1 + 1e-9 and -1 - 1e-9 <= r <= 1 + 1e-9
    assert kendall_tau(y, x) == pytest.approx(t)
    assert kendall_tau([v ** 3 + 7 for v in x], y) == pytest.approx(t)  # strictly increasing map
    assert kendall_tau([-v for v in x], y) == pytest.approx(-t)
    assert spearman_rho([math.exp(v / 10) for v in x], y) == pytest.approx(r)


def test_ranking_metrics_per_model_and_within_model_tau_hand_computed():
    from lbbench.predict import Prediction, paper_scheme
    from lbbench.predict.data import Example
    from lbbench.predict.evaluate import ranking_metrics

    # model a: true 10, 20, 30 predicted 1, 3, 2 -> tau (2 - 1) / 3; model b: true 100, 200 predicted in order -> 1
    rows = [Example(f"p{i}", t, pt, None, m) for i, (t, pt, m) in
            enumerate([(10, 5, "a"), (20, 4, "a"), (30, 3, "a"), (100, 2, "b"), (200, 1, "b")])]
    preds = [Prediction(0, e, e, 2 * e) for e in (1, 3, 2, 150, 250)]
    out = ranking_metrics(rows, preds, paper_scheme())
    per = {m["model"]: m for m in out["per_model"]}
    assert per["a"]["kendall_tau"] == pytest.approx(1 / 3) and per["b"]["kendall_tau"] == pytest.approx(1.0)
    assert out["within_model_kendall_tau"] == pytest.approx((3 * (1 / 3) + 2 * 1.0) / 5)
    # pooled: 10 pairs, only (20, 30) discordant -> (9 - 1) / 10
    assert out["kendall_tau"] == pytest.approx(0.8)
    assert out["mae_tokens"] == pytest.approx((9 + 17 + 28 + 50 + 50) / 5)
    # p50 = expected (1, 3, 2, 150, 250) and p90 = 2 x expected (2, 6, 4, 300, 500) both cover only 100 and 200
    assert out["p50_coverage"] == pytest.approx(2 / 5) and out["p90_coverage"] == pytest.approx(2 / 5)
    # prompt length falls as output grows: tau -1
    assert out["prompt_length_baseline_kendall_tau"] == pytest.approx(-1.0)
