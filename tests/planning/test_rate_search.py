"""The rate search: the bracket holds the threshold of a monotone curve; early stopping never flips a decision."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.planning.search import max_rate, sequential_attainment


def _step(threshold: float):
    """Attainment 1 up to ``threshold``, then below one half and falling: a monotone toy load curve."""
    return lambda rate: 1.0 if rate <= threshold else 0.5 * threshold / rate


@settings(max_examples=200, deadline=None)
@given(threshold=st.floats(0.5, 500.0), start=st.floats(0.5, 500.0), rel_tol=st.sampled_from([0.01, 0.05, 0.2]))
def test_the_bracket_contains_the_threshold_of_a_monotone_curve(threshold, start, rel_tol):
    calls: list[float] = []

    def evaluate(rate: float) -> float:
        calls.append(rate)
        return _step(threshold)(rate)

    res = max_rate(evaluate, 0.99, start, rel_tol=rel_tol)
    lo, hi = res.bracket
    assert res.converged and res.monotone and res.rate == lo
    assert lo <= threshold < hi <= lo * (1 + rel_tol) * (1 + 1e-12)
    assert res.attainment == 1.0 > 0.99 > res.attainment_above
    assert len(calls) == len(set(calls)) == len(res.points)  # no rate probed twice
    assert all(r <= lo for r, a in res.points.items() if a >= 0.99)
    assert all(r >= hi for r, a in res.points.items() if a < 0.99)


def test_the_probe_goes_down_when_the_start_misses_and_stops_at_the_floor():
    res = max_rate(_step(3.0), 0.95, 100.0, rel_tol=0.05)
    assert res.bracket[0] <= 3.0 < res.bracket[1] and min(res.points) < 3.0 < max(res.points) == 100.0
    none = max_rate(lambda r: 0.0, 0.95, 8.0, lo=1.0)
    assert none.rate is None and none.bracket == (None, 1.0) and not none.converged
    assert sorted(none.points) == [1.0, 2.0, 4.0, 8.0]


def test_a_capped_search_says_the_cap_still_met():
    res = max_rate(lambda r: 1.0, 0.95, 1.0, hi=10.0)
    assert res.rate == 10.0 and res.bracket == (10.0, None) and not res.converged


def test_a_rising_curve_is_flagged_not_monotone():
    curve = {1.0: 0.96, 2.0: 0.99, 4.0: 0.5}
    res = max_rate(lambda r: curve.get(r, 0.0 if r > 2 else 0.97), 0.95, 1.0, rel_tol=0.5)
    assert not res.monotone and res.bracket[0] >= 2.0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        max_rate(lambda r: 1.0, 1.5, 1.0)
    with pytest.raises(ValueError):
        max_rate(lambda r: 1.0, 0.9, 1.0, lo=2.0)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8), target=st.floats(0.01, 1.0))
def test_early_stopping_makes_the_decision_running_every_seed_makes(values, target):
    calls: list[int] = []

    def per_seed(k: int) -> float:
        calls.append(k)
        return values[k]

    probe = sequential_attainment(per_seed, len(values), target)
    full = sum(values) / len(values)
    assert probe.met == (full >= target)
    assert probe.low <= full + 1e-12 and full <= probe.high + 1e-12
    assert (probe.decided() >= target) == probe.met
    assert calls == list(range(probe.seeds_run))
    if not probe.stopped_early:
        assert probe.attainment == pytest.approx(full)


def test_a_clear_miss_stops_after_the_first_seed():
    calls: list[int] = []
    probe = sequential_attainment(lambda k: calls.append(k) or 0.2, 5, 0.95)
    assert calls == [0] and probe.stopped_early and not probe.met and probe.high == pytest.approx(0.84)


def test_rounded_rates_still_bracket_the_threshold():
    res = max_rate(_step(23.456), 0.95, 10.0, rel_tol=0.001, digits=3)
    lo, hi = res.bracket
    assert lo <= 23.456 < hi and res.converged
    assert all(float(f"{r:.3g}") == r for r in res.points)
