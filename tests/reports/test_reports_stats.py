"""Bootstrap intervals, block resampling and the t quantile."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.metrics.stats import (MEAN, Side, Stat, block_indices, bootstrap_change,
                                   side_from_rows, t_quantile, welch_change_ci)


def _side(values_by_seed, scale=None):
    return Side({s: np.arange(len(v)) for s, v in values_by_seed.items()},
                {s: np.asarray(v, float) for s, v in values_by_seed.items()}, scale)


@pytest.mark.parametrize("df,expected", [(1, 12.7062), (4, 2.7764), (10, 2.2281), (30, 2.0423)])
def test_t_quantile_matches_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-3)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-3)


def test_block_indices_in_range_and_contiguous():
    idx = block_indices(100, 5, np.random.default_rng(1))
    assert idx.shape == (5, 100)
    assert idx.min() >= 0 and idx.max() < 100
    # blocks of 10 consecutive (circular) indices
    first = idx[0, :10]
    assert all((first[k + 1] - first[k]) % 100 == 1 for k in range(9))


def test_identical_sides_give_zero_change():
    rng = np.random.default_rng(0)
    vals = {s: rng.exponential(5.0, 300) for s in (0, 1, 2)}
    ch = bootstrap_change(_side(vals), _side(vals), MEAN, num_resamples=200)
    assert ch.paired and ch.num_seeds == 3
    assert ch.change_pct == 0 and ch.ci_low_pct == 0 and ch.ci_high_pct == 0
    assert not ch.excludes_zero


def test_paired_shift_is_detected():
    rng = np.random.default_rng(0)
    base = {s: rng.exponential(5.0, 400) for s in (0, 1)}
    cand = {s: v * 1.10 + rng.normal(0, 0.05, len(v)) for s, v in base.items()}
    ch = bootstrap_change(_side(base), _side(cand), MEAN, num_resamples=300)
    assert ch.change_pct == pytest.approx(10.0, abs=0.5)
    assert ch.ci_low_pct > 5 and ch.excludes_zero


def test_unpaired_same_distribution_includes_zero():
    rng = np.random.default_rng(3)
    base = {s: rng.exponential(5.0, 300) for s in (0, 1, 2)}
    cand = {s: rng.exponential(5.0, 300) for s in (10, 11, 12)}
    ch = bootstrap_change(_side(base), _side(cand), MEAN, num_resamples=300)
    assert not ch.paired
    assert ch.ci_low_pct < 0 < ch.ci_high_pct


def test_quantile_stat_and_scale():
    base = {0: np.linspace(0, 10, 101)}
    cand = {0: np.linspace(0, 10, 101) * 2}
    ch = bootstrap_change(_side(base, {0: 3.0}), _side(cand, {0: 3.0}), Stat("quantile", 0.5),
                          num_resamples=100)
    assert ch.baseline == pytest.approx(15.0) and ch.candidate == pytest.approx(30.0)
    assert ch.change_pct == pytest.approx(100.0)


def test_welch_interval_contains_point():
    lo, hi = welch_change_ci([10, 11, 12], [12, 13, 14])
    assert lo < 100 * (13 - 11) / 11 < hi


def test_side_from_rows_sorts_by_seed_then_id():
    s = side_from_rows(np.array([1, 0, 1, 0]), np.array([5, 3, 2, 1]), np.array([1., 2., 3., 4.]))
    assert list(s.ids[0]) == [1, 3] and list(s.values[0]) == [4.0, 2.0]
    assert list(s.ids[1]) == [2, 5] and list(s.values[1]) == [3.0, 1.0]


@settings(max_examples=20, deadline=None)
@given(st.floats(0.5, 2.0), st.integers(20, 200), st.integers(0, 1000))
def test_interval_brackets_point_estimate(factor, n, seed):
    rng = np.random.default_rng(seed)
    base = {0: rng.exponential(1.0, n) + 0.1, 1: rng.exponential(1.0, n) + 0.1}
    cand = {s: v * factor for s, v in base.items()}
    ch = bootstrap_change(_side(base), _side(cand), MEAN, num_resamples=100, seed=seed)
    assert ch.change_pct == pytest.approx(100 * (factor - 1), abs=1e-6)
    assert ch.ci_low_pct <= ch.change_pct + 1e-9 <= ch.ci_high_pct + 2e-9
    assert math.isfinite(ch.ci_low_pct)
