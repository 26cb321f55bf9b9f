"""The instance-count search: minimal n for monotone attainment, n meets and n - 1 misses for any attainment."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.planning.search import TargetNotMetError, is_monotone, min_instances


def _recorder(f):
    calls: list[int] = []

    def evaluate(n: int) -> float:
        calls.append(n)
        return f(n)
    return evaluate, calls


@settings(max_examples=150, deadline=None)
@given(max_n=st.integers(1, 100), data=st.data(), target=st.floats(0.01, 1.0))
def test_monotone_attainment_gives_the_minimal_count(max_n, data, target):
    # a non-decreasing attainment curve over 1..max_n that reaches the target somewhere
    steps = data.draw(st.lists(st.floats(0.0, 1.0), min_size=max_n, max_size=max_n))
    curve, level = {}, 0.0
    for n, s in enumerate(steps, 1):
        level = max(level, s)
        curve[n] = level
    curve[max_n] = max(curve[max_n], target)
    evaluate, calls = _recorder(lambda n: curve[n])
    res = min_instances(evaluate, target, max_n)
    expected = min(n for n in curve if curve[n] >= target)
    assert res.instances == expected
    assert res.attainment == curve[expected]
    assert res.attainment_at_fewer == (curve[expected - 1] if expected > 1 else 0.0)
    assert res.monotone
    assert all(1 <= n <= max_n for n in calls) and len(calls) == len(set(calls))  # no count twice, never 0
    assert len(calls) <= 2 * max_n.bit_length() + 1  # probe + bisection: logarithmic


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=80), target=st.floats(0.01, 1.0))
def test_any_attainment_gives_n_meeting_and_n_minus_one_missing(values, target):
    max_n = len(values)
    curve = dict(enumerate(values, 1))
    if not any(v >= target for v in values):
        with pytest.raises(TargetNotMetError):
            min_instances(lambda n: curve[n], target, max_n)
        return
    try:
        res = min_instances(lambda n: curve[n], target, max_n)
    except TargetNotMetError:  # the probe stops at max_n; a non-monotone curve may meet only below it
        assert curve[max_n] < target
        return
    n = res.instances
    assert curve[n] >= target and res.attainment == curve[n]
    assert n == 1 or curve[n - 1] < target
    assert res.attainment_at_fewer == (curve[n - 1] if n > 1 else 0.0)
    assert res.points == {k: curve[k] for k in res.points}
    if not res.monotone:  # bisection was distrusted: every count below n was tried
        assert all(curve[k] < target for k in range(1, n))


def test_a_count_hidden_between_monotone_looking_points_is_not_searched_for():
    # 3 meets, but every point the search sees rises: 1, 2, 4 miss, 8 meets, then 6 and 7 miss. Nothing
    # observed contradicts monotonicity, so 8 is the answer (n - 1 = 7 does miss) and the row says monotone.
    curve = {1: 0.2, 2: 0.3, 3: 0.97, 4: 0.6, 5: 0.7, 6: 0.8, 7: 0.9, 8: 0.99}
    res = min_instances(curve.__getitem__, 0.95, 8)
    assert (res.instances, res.attainment_at_fewer, res.monotone) == (8, 0.9, True)
    assert set(res.points) == {1, 2, 4, 6, 7, 8}


def test_non_monotone_points_trigger_a_full_scan_below_the_answer():
    # probe: 1 miss (0.6), 2 miss (0.2: a drop), 4 meets; bisection: 3 misses -> n = 4 with a drop seen
    curve = {1: 0.6, 2: 0.2, 3: 0.5, 4: 0.99}
    res = min_instances(curve.__getitem__, 0.95, 4)
    assert res.instances == 4 and res.attainment_at_fewer == 0.5
    assert res.monotone is False and set(res.points) == {1, 2, 3, 4}


def test_target_out_of_reach_names_the_attainment_at_the_cap():
    with pytest.raises(TargetNotMetError, match="0.9000 at 8 instances"):
        min_instances(lambda n: 0.9, 0.95, 8)


@pytest.mark.parametrize("target,max_n", [(0.0, 4), (1.5, 4), (0.9, 0)])
def test_bad_arguments(target, max_n):
    with pytest.raises(ValueError):
        min_instances(lambda n: 1.0, target, max_n)


def test_is_monotone():
    assert is_monotone({1: 0.1, 2: 0.1, 4: 0.5})
    assert not is_monotone({1: 0.1, 2: 0.05, 4: 0.5})
    assert is_monotone({1: 0.1, 2: 0.05}, tolerance=0.1)
