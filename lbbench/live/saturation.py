"""Saturation: a backlog that keeps growing, told apart from a burst that drains.

A step of a load sweep is *saturated* when the cluster finishes requests more slowly than they arrive, for long
enough that waiting longer only lengthens the queue. The backlog (requests arrived and not yet ended: the
router's queue plus the requests in flight) then grows without bound; the run can stop sending and go on with
the sweep instead of queueing for minutes.

``SaturationDetector`` is fed ``(time, backlog)`` samples and keeps those of the last ``window_s``. It reports
saturation at a sample when, over that window,

1. the samples span the whole window (a run younger than ``window_s`` is never saturated);
2. the least-squares slope of backlog against time exceeds ``threshold_per_s`` (requests per second), and the
   growth it implies over the window is at least ``MIN_GROWTH`` requests (a handful of requests that arrive
   together at a low rate is not a queue that grows);
3. the growth lasted the whole window: the window's four quarters have rising mean backlogs (each quarter's mean
   above the previous one's); and
4. it still lasts: the least-squares slope of the last quarter is positive (the backlog is not draining).

The second condition alone would fire on a burst: a window ending at the top of a short surge has a steep
least-squares slope although its first quarters are flat. The third asks that the backlog grew throughout the
window, and quarter means (not single samples) keep it robust to the noise of Poisson arrivals; the fourth
rejects a window that ends while a burst drains. A burst shorter than the window therefore never saturates; one
that keeps growing for a whole window is, by this definition, saturation. Noise can only delay the mark by a few
samples (a quarter's own slope is noisy), never prevent it while the backlog grows.

The live replay (``lbbench.harness.replay``) samples its backlog on the wall clock and stops sending at the
first saturated sample; the simulator's records are judged after the run by ``saturated_at`` over the same
backlog rebuilt from the records (``backlog_samples``), so that both mark the same condition.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

#: the share of the step's mean arrival rate the backlog must grow by (per second) when no threshold is given:
#: a quarter of the arrivals left unserved for a whole window is overload, not chance. At 0.1 and a 10 s window a
#: stable mixed fleet at 4 req/s (paper-length requests overlapping on its slow instances) was marked saturated
#: when its backlog rose from 6 to 16 by chance.
DEFAULT_THRESHOLD_SHARE = 0.25
#: long enough that a burst of slow requests drains within it
DEFAULT_WINDOW_S = 30.0
#: the window is judged in this many parts, each of which must hold more backlog than the one before
QUARTERS = 4
#: fewest samples a window needs to be judged
MIN_SAMPLES = 8
#: fewest requests the backlog must grow by over a window (slope x window)
MIN_GROWTH = 8.0


@dataclass(frozen=True)
class SaturationPolicy:
    """What a live run does about saturation: the detector's threshold and window; ``stop`` sending when it
    fires (False: only mark); then ``drain`` the requests in flight or ``cancel`` them."""

    threshold_per_s: float
    window_s: float = DEFAULT_WINDOW_S
    stop: bool = True
    on_saturation: str = "drain"


def sample_interval(window_s: float) -> float:
    """How often to sample the backlog for a window: about 40 samples a window, within [0.01 s, 0.5 s]."""
    return min(0.5, max(0.01, window_s / 40))


def default_threshold(arrival_times: Sequence[float]) -> float:
    """``DEFAULT_THRESHOLD_SHARE`` of the mean arrival rate of ``arrival_times`` (at least 0.1 requests/s): the
    backlog grows by a quarter of the offered load, i.e. the cluster keeps up with less than 75 % of it."""
    n = len(arrival_times)
    span = (max(arrival_times) - min(arrival_times)) if n > 1 else 0.0
    rate = (n - 1) / span if span > 0 else 0.0
    return max(0.1, DEFAULT_THRESHOLD_SHARE * rate)


def slope(samples: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of ``(t, y)`` samples (0 when their times do not vary)."""
    n = len(samples)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in samples) / n
    my = sum(y for _, y in samples) / n
    sxx = sum((t - mt) ** 2 for t, _ in samples)
    if sxx <= 0:
        return 0.0
    return sum((t - mt) * (y - my) for t, y in samples) / sxx


class SaturationDetector:
    """Judges a backlog's growth over a sliding window (see the module docstring); pure, no clock of its own."""

    def __init__(self, threshold_per_s: float, window_s: float = DEFAULT_WINDOW_S):
        if not threshold_per_s > 0:
            raise ValueError(f"saturation threshold {threshold_per_s:g} must be > 0 requests/s")
        if not window_s > 0:
            raise ValueError(f"saturation window {window_s:g} must be > 0 s")
        self.threshold_per_s = float(threshold_per_s)
        self.window_s = float(window_s)
        self.samples: deque[tuple[float, float]] = deque()
        self._first_t: float | None = None
        #: time of the first saturated sample (None: not saturated yet); it stays set
        self.saturated_at_s: float | None = None
        #: the slope of the window that saturated
        self.slope_per_s: float | None = None

    @property
    def saturated(self) -> bool:
        return self.saturated_at_s is not None

    def add(self, t: float, backlog: float) -> bool:
        """Feed one sample (times not decreasing); True when the backlog is saturated at ``t`` (and after)."""
        if self.saturated_at_s is not None:
            return True
        if self._first_t is None:
            self._first_t = t
        self.samples.append((t, float(backlog)))
        while self.samples and self.samples[0][0] < t - self.window_s:
            self.samples.popleft()
        if t - self._first_t < self.window_s or len(self.samples) < MIN_SAMPLES:
            return False
        s = slope(self.samples)
        if s > self.threshold_per_s and s * self.window_s >= MIN_GROWTH and self._grew_throughout(t):
            self.saturated_at_s, self.slope_per_s = t, s
            return True
        return False

    def _grew_throughout(self, t: float) -> bool:
        start = t - self.window_s
        part = self.window_s / QUARTERS
        sums = [0.0] * QUARTERS
        counts = [0] * QUARTERS
        for ts, y in self.samples:
            k = min(QUARTERS - 1, max(0, int((ts - start) / part)))
            sums[k] += y
            counts[k] += 1
        if not all(counts):
            return False
        means = [s / c for s, c in zip(sums, counts)]
        if not all(b > a for a, b in zip(means, means[1:])):
            return False
        return slope([(ts, y) for ts, y in self.samples if ts >= t - part]) > 0


def saturated_at(samples: Iterable[tuple[float, float]], threshold_per_s: float,
                 window_s: float = DEFAULT_WINDOW_S) -> float | None:
    """The time of the first saturated sample of ``samples`` (None: never)."""
    det = SaturationDetector(threshold_per_s, window_s)
    for t, b in samples:
        if det.add(t, b):
            return det.saturated_at_s
    return None


def backlog_at(arrivals: Sequence[float], ends: Sequence[float | None], times: Sequence[float]) -> list[int]:
    """The backlog (arrived and not yet ended) at each of ``times``; an end of None or inf never comes."""
    a = sorted(arrivals)
    e = sorted(x for x in ends if x is not None and math.isfinite(x))
    return [bisect.bisect_right(a, t) - bisect.bisect_right(e, t) for t in times]


def backlog_samples(arrivals: Sequence[float], ends: Sequence[float], interval_s: float,
                    until_s: float | None = None) -> list[tuple[float, float]]:
    """The backlog (arrived and not yet ended) every ``interval_s`` from the first arrival to ``until_s``
    (default: the last arrival, after which nothing is left to stop sending)."""
    if not arrivals:
        return []
    t0, t1 = min(arrivals), (max(arrivals) if until_s is None else until_s)
    times = [t0 + k * interval_s for k in range(int((t1 - t0) / interval_s) + 1)]
    return [(t, float(b)) for t, b in zip(times, backlog_at(arrivals, ends, times))]


def records_saturated_at(records: Sequence, threshold_per_s: float, window_s: float = DEFAULT_WINDOW_S
                         ) -> float | None:
    """When the backlog of a run's records (``RequestRecord``s: arrived at ``arrival_s``, ended at ``finish_s``,
    or, failed, at their last known time) first saturated, sampled as the live replay samples it (None: never)."""
    arrivals = [r.arrival_s for r in records]
    ends = [r.finish_s if r.finish_s is not None else
            max(t for t in (r.arrival_s, r.dispatch_s, r.first_token_s) if t is not None) for r in records]
    return saturated_at(backlog_samples(arrivals, ends, sample_interval(window_s)), threshold_per_s, window_s)
