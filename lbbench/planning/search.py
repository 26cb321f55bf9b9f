"""The smallest instance count that meets a target: an exponential probe, then bisection, then a check.

``min_instances(evaluate, target, max_instances)`` knows nothing of simulators: ``evaluate(n)`` returns a
number in [0, 1] (the SLO attainment of ``n`` instances) and the search asks for as few counts as it can:

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
