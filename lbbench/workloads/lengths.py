"""Token-length distributions shared by the synthetic workloads.

Three building blocks, each drawing whole token counts from a numpy
``Generator``:

- ``LognormalLength``: ``clip(rint(exp(N(mu, sigma))), lo, hi)``. ``for_mean``
  solves ``mu`` so that the mean *after* rounding and clipping is exact (the
  expectation is summed over the integers ``lo..hi`` from the normal CDF, so no
  sampling is involved); ``from_mean_cv`` is the plain moment match used by the
  generic Poisson workload.
- ``HurdleLength``: a two-part model for decode lengths that must hit both a
  mean and the share of requests at or above a threshold (the paper's "heavy
  decode"); see its docstring for the fit.
- ``FixedLength``: every request the same length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .errors import WorkloadError

_erf = np.frompyfunc(math.erf, 1, 1)


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(z / math.sqrt(2.0)).astype(np.float64))


@lru_cache(maxsize=256)
def _discrete_lognormal_mean(mu: float, sigma: float, lo: int, hi: int) -> float:
    """Exact ``E[clip(rint(exp(N(mu, sigma))), lo, hi)]``."""
    ks = np.arange(lo, hi + 1, dtype=np.float64)
    # P(rint(X) <= k) = P(X < k + 0.5); the clip puts all mass below lo+0.5 on lo
    upper = _norm_cdf((np.log(ks + 0.5) - mu) / sigma)
    upper[-1] = 1.0
    lower = np.concatenate(([0.0], upper[:-1]))
    return float(np.sum(ks * (upper - lower)))


@dataclass(frozen=True)
class FixedLength:
    tokens: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)

    @property
    def mean_tokens(self) -> float:
        return float(self.tokens)


@dataclass(frozen=True)
class LognormalLength:
    """Whole-token lognormal, rounded and clipped to ``[lo, hi]``."""

    mu: float
    sigma: float
    lo: int = 1
    hi: int | None = None

    @classmethod
    def from_mean_cv(cls, mean_tokens: float, cv: float, lo: int = 1,
                     hi: int | None = None) -> "LognormalLength":
        """Moment match of the continuous lognormal (before rounding/clipping)."""
        if not (mean_tokens > 0 and math.isfinite(mean_tokens)):
            raise WorkloadError(f"length mean must be > 0, got {mean_tokens!r}")
        if not (cv >= 0 and math.isfinite(cv)):
            raise WorkloadError(f"length cv must be >= 0, got {cv!r}")
        sigma2 = math.log1p(cv * cv)
        return cls(mu=math.log(mean_tokens) - sigma2 / 2, sigma=math.sqrt(sigma2), lo=lo, hi=hi)

    @classmethod
    def for_mean(cls, mean_tokens: float, sigma: float, lo: int = 1, hi: int = 1000) -> "LognormalLength":
        """Solve ``mu`` so the rounded, clipped mean equals ``mean_tokens`` exactly."""
        if not lo < mean_tokens < hi:
            raise WorkloadError(f"length mean {mean_tokens} must lie strictly between {lo} and {hi}")
        a, b = math.log(max(lo, 0.5)) - 10 * sigma, math.log(hi) + 10 * sigma
        for _ in range(100):
            mid = 0.5 * (a + b)
            if _discrete_lognormal_mean(mid, sigma, lo, hi) < mean_tokens:
                a = mid
            else:
                b = mid
        return cls(mu=0.5 * (a + b), sigma=sigma, lo=lo, hi=hi)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.rint(np.exp(rng.normal(self.mu, self.sigma, size=n)))
        return np.clip(x, self.lo, self.hi if self.hi is not None else np.inf).astype(np.int64)

    @property
    def mean_tokens(self) -> float:
        if self.hi is None:
            return math.exp(self.mu + self.sigma ** 2 / 2)  # ignores rounding and the low clip
        return _discrete_lognormal_mean(self.mu, self.sigma, self.lo, self.hi)


@dataclass(frozen=True)
class HurdleLength:
    """Decode lengths with a given mean and a given share at or above ``threshold``.

    With threshold ``T``, target mean ``m`` and heavy share ``p``:

    - with probability ``1 - p`` the length is *light*: ``1 + BetaBinomial(T - 2,
      a, b)``, so it lies in ``[1, T - 1]``, with ``a + b = concentration`` and
      mean ``m_light``;
    - with probability ``p`` it is *heavy*: ``T - 1 + Geometric(q)``, so it lies
      in ``[T, ...)`` with an exponential-like tail of mean excess ``m_light``
      (``q = 1 / (m_light + 1)``).

    The mean is then ``(1 - p) m_light + p (T + m_light) = m_light + p T``, so
    ``m_light = m - p T`` matches the mean exactly and the heavy share is ``p``
    by construction. Two moments are all the paper's Table 1 gives; tying the
    heavy tail's mean excess to the light mean is the one extra modelling
    choice. Lengths above ``hi`` are clipped (a negligible change of the mean
    for the paper's tasks; ``check_fit`` measures it).
    """

    mean_tokens: float
    heavy_share: float
    threshold: int = 250
    concentration: float = 3.0
    hi: int = 3072

    def __post_init__(self) -> None:
        m_light = self.light_mean_tokens
        if not 0.0 <= self.heavy_share < 1.0:
            raise WorkloadError(f"heavy share must be in [0, 1), got {self.heavy_share}")
        if not 1.0 < m_light < self.threshold - 1:
            raise WorkloadError(
                f"mean {self.mean_tokens} and heavy share {self.heavy_share} at threshold "
                f"{self.threshold} leave a light mean of {m_light:.2f}, outside (1, {self.threshold - 1})")

    @property
    def light_mean_tokens(self) -> float:
        return self.mean_tokens - self.heavy_share * self.threshold

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        m_light = self.light_mean_tokens
        span = self.threshold - 2
        a = self.concentration * (m_light - 1.0) / span
        b = self.concentration - a
        heavy = rng.random(n) < self.heavy_share
        light = 1 + rng.binomial(span, rng.beta(a, b, size=n))
        tail = self.threshold - 1 + rng.geometric(1.0 / (m_light + 1.0), size=n)
        return np.minimum(np.where(heavy, tail, light), self.hi).astype(np.int64)
