"""Arrival processes for synthetic workloads.

Inter-arrival gaps are gamma distributed with mean ``1 / rate_per_s`` and
coefficient of variation ``burstiness``: shape ``k = 1 / burstiness**2`` and
scale ``1 / (rate_per_s * k)``. ``burstiness = 1`` gives exponential gaps (a
Poisson process); larger values give burstier traffic (clusters of arrivals
separated by long pauses) at the same mean rate, smaller ones a more regular
stream (``burstiness -> 0`` tends to a fixed interval).

The first request arrives at 0 s, the same convention as canonical traces, so
a synthetic workload and a trace line up on one time axis.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import WorkloadError


def check_rate(num_requests: int, rate_per_s: float, burstiness: float = 1.0) -> None:
    """Raise ``WorkloadError`` for a negative count, a non-positive rate or burstiness."""
    if int(num_requests) != num_requests or num_requests < 0:
        raise WorkloadError(f"requests: must be a whole number >= 0, got {num_requests!r}")
    if not (isinstance(rate_per_s, (int, float)) and math.isfinite(rate_per_s) and rate_per_s > 0):
        raise WorkloadError(f"rate: must be a finite number > 0 (requests per second), got {rate_per_s!r}")
    if not (isinstance(burstiness, (int, float)) and math.isfinite(burstiness) and burstiness > 0):
        raise WorkloadError(f"burstiness: must be a finite number > 0 (1 = Poisson), got {burstiness!r}")


def interarrival_gaps(n: int, rate_per_s: float, rng: np.random.Generator,
                      burstiness: float = 1.0) -> np.ndarray:
    """``n`` gamma-distributed gaps (seconds) with mean ``1/rate_per_s`` and CV ``burstiness``."""
    check_rate(n, rate_per_s, burstiness)
    if burstiness == 1.0:
        return rng.exponential(1.0 / rate_per_s, size=n)
    shape = 1.0 / (burstiness * burstiness)
    return rng.gamma(shape, 1.0 / (rate_per_s * shape), size=n)


def arrival_times(n: int, rate_per_s: float, rng: np.random.Generator,
                  burstiness: float = 1.0) -> np.ndarray:
    """Sorted arrival times (seconds) of ``n`` requests, the first at 0."""
    check_rate(n, rate_per_s, burstiness)
    gaps = interarrival_gaps(max(n - 1, 0), rate_per_s, rng, burstiness)
    out = np.zeros(int(n), dtype=np.float64)
    if n > 1:
        np.cumsum(gaps, out=out[1:])
    return out
