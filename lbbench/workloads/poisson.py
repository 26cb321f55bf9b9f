"""Generic synthetic workload: Poisson (or gamma-bursty) arrivals, given lengths.

A length is either a whole number (every request the same) or ``(mean, cv)``:
a lognormal with that mean and coefficient of variation, rounded to whole
tokens and at least 1. ``parse_length_spec`` reads the command-line form
``N`` or ``MEAN:CV``.
"""

from __future__ import annotations

import math

import numpy as np

from ..core import Request
from .arrivals import arrival_times, check_rate
from .errors import WorkloadError
from .lengths import FixedLength, LognormalLength

LengthSpec = int | tuple[float, float]


def length_model(spec: LengthSpec, what: str = "length") -> FixedLength | LognormalLength:
    if isinstance(spec, bool):
        raise WorkloadError(f"{what}: expected a token count or (mean, cv), got {spec!r}")
    if isinstance(spec, (int, np.integer)):
        if spec < 1:
            raise WorkloadError(f"{what}: must be >= 1 token, got {spec}")
        return FixedLength(int(spec))
    if isinstance(spec, tuple) and len(spec) == 2:
        mean, cv = float(spec[0]), float(spec[1])
        if not (math.isfinite(mean) and mean >= 1):
            raise WorkloadError(f"{what}: mean must be >= 1 token, got {spec[0]!r}")
        if not (math.isfinite(cv) and cv >= 0):
            raise WorkloadError(f"{what}: cv must be >= 0, got {spec[1]!r}")
        if cv == 0:
            return FixedLength(max(1, round(mean)))
        return LognormalLength.from_mean_cv(mean, cv, lo=1)
    raise WorkloadError(f"{what}: expected a token count or (mean, cv), got {spec!r}")


def parse_length_spec(text: str, what: str = "length") -> LengthSpec:
    """``"128"`` -> 128; ``"200:1.5"`` -> (200.0, 1.5) (lognormal mean 200, cv 1.5)."""
    parts = str(text).strip().split(":")
    try:
        if len(parts) == 1:
            value: LengthSpec = int(parts[0])
        elif len(parts) == 2:
            value = (float(parts[0]), float(parts[1]))
        else:
            raise ValueError
    except ValueError:
        raise WorkloadError(f"{what}: expected N or MEAN:CV, got {text!r}") from None
    length_model(value, what)  # validate
    return value


def poisson(num_requests: int, rate_per_s: float, seed: int, prompt_tokens: LengthSpec = 128,
            output_tokens: LengthSpec = 128, burstiness: float = 1.0, task: str | None = None) -> list[Request]:
    """``num_requests`` requests at ``rate_per_s`` with the given length specs."""
    check_rate(num_requests, rate_per_s, burstiness)
    p_model = length_model(prompt_tokens, "prompt_tokens")
    o_model = length_model(output_tokens, "output_tokens")
    arrival_rng, length_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    times = arrival_times(num_requests, rate_per_s, arrival_rng, burstiness)
    prompts = p_model.sample(length_rng, num_requests)
    outputs = o_model.sample(length_rng, num_requests)
    return [Request(request_id=i, arrival_s=float(times[i]), prompt_tokens=int(prompts[i]),
                    output_tokens=int(outputs[i]), task=task) for i in range(num_requests)]
