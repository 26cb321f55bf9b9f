"""Arrival processes: sorted, start at 0, right mean rate and burstiness."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.workloads import WorkloadError, arrival_times
from lbbench.workloads.arrivals import interarrival_gaps


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), rate=st.floats(0.01, 1e4), burst=st.floats(0.1, 8.0),
       seed=st.integers(0, 2**32 - 1))
def test_arrivals_sorted_start_at_zero(n, rate, burst, seed):
    t = arrival_times(n, rate, np.random.default_rng(seed), burst)
    assert t.shape == (n,)
    assert np.all(np.diff(t) >= 0)
    assert np.all(np.isfinite(t))
    if n:
        assert t[0] == 0.0


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 2.0, 4.0])
def test_gap_mean_and_cv(burstiness):
    gaps = interarrival_gaps(200_000, 20.0, np.random.default_rng(1), burstiness)
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(burstiness, rel=0.05)


def test_burstier_traffic_clusters_more():
    rng = np.random.default_rng(3)
    calm = arrival_times(20_000, 10.0, rng, 1.0)
    bursty = arrival_times(20_000, 10.0, rng, 4.0)
    # count arrivals per 1 s bin: bursty traffic has a much larger variance at the same mean
    calm_counts = np.bincount(calm.astype(int))
    bursty_counts = np.bincount(bursty.astype(int))
    assert bursty_counts.var() > 4 * calm_counts.var()


def test_same_seed_same_times():
    a = arrival_times(100, 5.0, np.random.default_rng(7))
    b = arrival_times(100, 5.0, np.random.default_rng(7))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("n, rate, burst, what", [
    (-1, 1.0, 1.0, "requests"), (10, 0.0, 1.0, "rate"), (10, float("inf"), 1.0, "rate"),
    (10, 1.0, 0.0, "burstiness"), (2.5, 1.0, 1.0, "requests"),
])
def test_bad_parameters_name_the_parameter(n, rate, burst, what):
    with pytest.raises(WorkloadError, match=what):
        arrival_times(n, rate, np.random.default_rng(0), burst)
