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
