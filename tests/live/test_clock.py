"""The ping-pong clock-offset estimate on a fake skewed clock: hand-computed values and the error bound."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbbench.live.clock import estimate_offset, measure_offset


class FakeLink:
    """A worker whose clock runs ``skew_s`` ahead of the driver's, talking over legs of given delays."""

    def __init__(self, skew_s: float, legs: list[tuple[float, float]]):
        self.skew_s = skew_s
        self.legs = iter(legs)
        self.driver_t = 100.0  # the driver's clock; the worker's reads driver_t + skew_s

    def worker_clock(self) -> float:
        return self.driver_t + self.skew_s

    def ask_driver(self) -> float:
        up, down = next(self.legs)
        self.driver_t += up  # the ping travels
        answer = self.driver_t  # the driver reads its clock
        self.driver_t += down  # the pong travels
        return answer


def test_hand_computed_offset_keeps_the_minimum_round_trip():
    # worker 2.5 s ahead; rounds with (up, down) legs of (3, 1) ms, (1, 1) ms and (10, 2) ms
    link = FakeLink(2.5, [(0.003, 0.001), (0.001, 0.001), (0.010, 0.002)])
    est = measure_offset(link.worker_clock, link.ask_driver, rounds=3)
    assert est.rtt_s == pytest.approx(0.002)
    assert est.offset_s == pytest.approx(2.5)  # the symmetric round is exact
    # the first round alone: t0 = 102.5, driver reads 100.003, t1 = 102.504 -> offset 2.502 - 0.003 = 2.499
    assert estimate_offset([(102.5, 100.003, 102.504)]).offset_s == pytest.approx(2.499)
    assert est.to_driver(102.5) == pytest.approx(100.0)


def test_no_rounds_or_a_backwards_round_is_an_error():
    with pytest.raises(ValueError, match="no ping-pong rounds"):
        estimate_offset([])
    with pytest.raises(ValueError, match="ends before it starts"):
        estimate_offset([(2.0, 1.0, 1.5)])


delays = st.floats(0.0, 0.05, allow_nan=False)


@given(skew=st.floats(-1e6, 1e6, allow_nan=False), legs=st.lists(delays, min_size=1, max_size=10))
def test_symmetric_delays_give_the_exact_offset(skew, legs):
    link = FakeLink(skew, [(d, d) for d in legs])
    est = measure_offset(link.worker_clock, link.ask_driver, rounds=len(legs))
    assert est.offset_s == pytest.approx(skew, abs=1e-6)


@given(skew=st.floats(-1e6, 1e6, allow_nan=False), legs=st.lists(st.tuples(delays, delays), min_size=1, max_size=10))
def test_the_error_is_at_most_half_the_minimum_round_trip(skew, legs):
    link = FakeLink(skew, legs)
    est = measure_offset(link.worker_clock, link.ask_driver, rounds=len(legs))
    assert est.rtt_s == pytest.approx(min(u + d for u, d in legs), abs=1e-6)
    assert abs(est.offset_s - skew) <= est.max_error_s + 1e-6
