"""The searches planning shares: an exponential probe, then bisection, then a check, on paired seeds.

Three pieces, none of which knows of simulators (``evaluate`` returns an attainment in [0, 1]):

- ``min_instances(evaluate, target, max_instances)``: the smallest instance count meeting ``target``
  (``lbbench plan``, and each GPU's uniform count under ``plan --mix``);
- ``max_rate(evaluate, target, start)``: the highest arrival rate meeting ``target``, with its bracket
  [last rate meeting, first missing] (``lbbench run --find-rate``);
- ``sequential_attainment(per_seed, seeds, target)``: one point over paired seeds that stops as soon as the
  remaining seeds cannot change whether it meets the target (exact, not statistical).

``min_instances``:

1. **Probe** 1, 2, 4, ... (capped at ``max_instances``) until a count meets the target.
2. **Bisect** between the last count that missed and the first that met, keeping "``lo`` misses, ``hi``
   meets" true, until they are adjacent: ``hi`` meets and ``hi - 1`` misses, both evaluated.
3. **Check monotonicity.** Attainment measured on a finite sample need not grow with the instance count
   (routing and batching decisions change with it). If the evaluated points are not non-decreasing in the
   count, the search no longer trusts bisection below ``hi`` and evaluates every count it skipped there,
   downwards; the answer is then the smallest count that met the target at all, and ``monotone`` is False.

Zero instances serve no request, so their attainment is 0 by definition (``attainment_at_fewer`` of a
one-instance answer); ``evaluate`` is never called with 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class TargetNotMetError(ValueError):
    """Even ``max_instances`` instances miss the target (the message gives the attainment there)."""

    def __init__(self, message: str, attainment: float, max_instances: int):
        super().__init__(message)
        self.attainment = attainment
        self.max_instances = max_instances


@dataclass(frozen=True)
class SearchResult:
    instances: int
    """The smallest count found that meets the target."""
    attainment: float
    attainment_at_fewer: float
    """At ``instances - 1`` (0 for one instance: zero instances serve nothing)."""
    points: dict[int, float]
    """Every evaluated count and its attainment."""
    monotone: bool
    """Whether the evaluated attainments never fell as the count grew."""


def is_monotone(points: dict[int, float], tolerance: float = 0.0) -> bool:
    """True when attainment never drops by more than ``tolerance`` from a count to a larger one."""
    best = float("-inf")
    for n in sorted(points):
        if points[n] < best - tolerance:
            return False
        best = max(best, points[n])
    return True


def min_instances(evaluate: Callable[[int], float], target: float, max_instances: int) -> SearchResult:
    """The smallest instance count whose ``evaluate`` meets ``target`` (see the module docstring)."""
    if not 0 < target <= 1:
        raise ValueError(f"attainment target {target:g} is outside (0, 1]")
    if max_instances < 1:
        raise ValueError(f"max_instances {max_instances} must be >= 1")
    points: dict[int, float] = {}

    def meets(n: int) -> bool:
        if n == 0:
            return False
        if n not in points:
            points[n] = float(evaluate(n))
        return points[n] >= target

    lo, hi = 0, 1  # invariant once the probe ends: lo misses (0 by definition), hi meets
    while not meets(hi):
        if hi >= max_instances:
            raise TargetNotMetError(
                f"attainment {points[hi]:.4f} at {hi} instances is below the target {target:g}", points[hi], hi)
        lo, hi = hi, min(2 * hi, max_instances)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    monotone = is_monotone(points)
    if not monotone:  # bisection's skipped counts cannot be trusted: look at every count below hi
        for n in range(hi - 1, 0, -1):
            meets(n)
        hi = min(n for n in points if points[n] >= target)
    return SearchResult(instances=hi, attainment=points[hi], attainment_at_fewer=points.get(hi - 1, 0.0),
                        points=dict(sorted(points.items())), monotone=monotone and is_monotone(points))


# ------------------------------------------------------------------------------------------------ rates


@dataclass(frozen=True)
class RateResult:
    """The highest rate found meeting the target, between ``bracket``'s ends."""

    rate: float | None
    """The last rate that met the target (None: even the lowest rate probed missed)."""
    bracket: tuple[float | None, float | None]
    """(last rate meeting, first rate missing): the threshold lies between. ``None`` above: the cap ``hi`` still
    met; ``None`` below: nothing probed met."""
    attainment: float | None
    """At ``rate``."""
    attainment_above: float | None
    """At the bracket's upper end."""
    points: dict[float, float]
    """Every probed rate and its attainment (a probe stopped early has its bound: see ``Probe``)."""
    monotone: bool
    """Whether the evaluated attainments never rose as the rate grew."""
    converged: bool
    """Whether the bracket is within the relative tolerance (False: a cap or ``max_probes`` ended the search)."""


def max_rate(evaluate: Callable[[float], float], target: float, start: float, *, rel_tol: float = 0.02,
             lo: float | None = None, hi: float | None = None, factor: float = 2.0,
             max_probes: int = 40, digits: int | None = None) -> RateResult:
    """The highest arrival rate whose ``evaluate(rate)`` (an attainment in [0, 1]) meets ``target``.

    1. **Probe** exponentially from ``start``: up by ``factor`` while it meets (at most to ``hi``), or down by
       ``factor`` while it misses (at least to ``lo``, default ``start / 1024``).
    2. **Bisect** geometrically between the last rate that met and the first that missed until the upper end
       is within ``rel_tol`` of the lower (``hi_rate <= lo_rate * (1 + rel_tol)``).
    3. **Check** that the attainments never rose with the rate (``monotone``); bisection keeps "every probed
       rate below the bracket met, every one above missed" by construction, so the bracket holds for the
       points evaluated whatever the curve.

    Attainment is assumed to fall (weakly) as load grows; on a curve that does, the true threshold (the
    supremum of meeting rates) lies in the bracket. ``digits``: probe only rates rounded to that many
    significant digits (readable run names); bisection also ends when the rounded midpoint is an end.
    """
    if not 0 < target <= 1:
        raise ValueError(f"attainment target {target:g} is outside (0, 1]")
    if not start > 0 or factor <= 1 or rel_tol <= 0:
        raise ValueError("need start > 0, factor > 1 and rel_tol > 0")
    lo_cap = start / 1024 if lo is None else lo
    hi_cap = float("inf") if hi is None else hi
    if not 0 < lo_cap <= start <= hi_cap:
        raise ValueError(f"need 0 < lo <= start <= hi (lo {lo_cap:g}, start {start:g}, hi {hi_cap:g})")
    points: dict[float, float] = {}

    def rounded(rate: float) -> float:
        return rate if digits is None else float(f"{rate:.{digits}g}")

    def meets(rate: float) -> bool:
        if rate not in points:
            points[rate] = float(evaluate(rate))
        return points[rate] >= target

    good: float | None = None  # invariant: every probed rate <= good met ...
    bad: float | None = None  # ... and every probed rate >= bad missed
    rate = start
    if meets(rate):
        good = rate
        while good < hi_cap and len(points) < max_probes:
            rate = min(rounded(good * factor), hi_cap)
            if meets(rate):
                good = rate
            else:
                bad = rate
                break
    else:
        bad = rate
        while bad > lo_cap and len(points) < max_probes:
            rate = max(rounded(bad / factor), lo_cap)
            if meets(rate):
                good = rate
                break
            bad = rate
    while good is not None and bad is not None and bad > good * (1 + rel_tol) and len(points) < max_probes:
        mid = rounded((good * bad) ** 0.5)
        if mid in (good, bad):
            break
        if meets(mid):
            good = mid
        else:
            bad = mid
    converged = good is not None and bad is not None and (bad <= good * (1 + rel_tol)
                                                          or rounded((good * bad) ** 0.5) in (good, bad))
    by_rate = dict(sorted(points.items()))
    falling = is_monotone({-r: a for r, a in by_rate.items()})  # non-increasing in the rate
    return RateResult(rate=good, bracket=(good, bad), attainment=None if good is None else points[good],
                      attainment_above=None if bad is None else points[bad], points=by_rate, monotone=falling,
                      converged=converged)


# ------------------------------------------------------------------------------------------------ early stop


@dataclass(frozen=True)
class Probe:
    """One point's attainment over paired seeds, possibly stopped before the last seed."""

    attainment: float
    """The mean over the seeds run (all of them unless ``stopped_early``)."""
    seeds_run: int
    seeds: int
    low: float
    """The smallest mean every seed could give, knowing the seeds run (each seed's attainment is in [0, 1])."""
    high: float
    """The largest."""
    met: bool
    """Whether the full mean meets the target (known exactly, early stop or not)."""

    @property
    def stopped_early(self) -> bool:
        return self.seeds_run < self.seeds

    def decided(self) -> float:
        """A number on the same side of the target as the full mean is: the mean when every seed ran, else the
        bound that decided (``low`` when it met, ``high`` when it missed)."""
        if not self.stopped_early:
            return self.attainment
        return self.low if self.met else self.high


def sequential_attainment(per_seed: Callable[[int], float], seeds: int, target: float) -> Probe:
    """Run ``per_seed(k)`` for k = 0, 1, ... and stop as soon as the mean over all ``seeds`` can no longer
    reach, or can no longer miss, ``target``.

    After ``k`` seeds with attainments summing to ``s``, the full mean lies in [s / seeds,
    (s + seeds - k) / seeds] whatever the other seeds give; once that interval is wholly below the target (a
    clear miss, typical of a probe far past the threshold) or wholly at or above it (a clear meet), the
    remaining seeds cannot change the decision, so they are not run. The decision is therefore exactly the one
    running every seed would make; only the attainment reported is then the partial mean.
    """
    if seeds < 1:
        raise ValueError("seeds must be >= 1")
    total = 0.0
    for k in range(1, seeds + 1):
        total += float(per_seed(k - 1))
        low, high = total / seeds, (total + seeds - k) / seeds
        if k < seeds and (high < target or low >= target):
            return Probe(total / k, k, seeds, low, high, low >= target)
    mean = total / seeds
    return Probe(mean, seeds, seeds, mean, mean, mean >= target)
