"""Fixtures for the live-harness tests: emulated fleets on free ports."""

from __future__ import annotations

import numpy as np
import pytest

from lbbench.core import Request
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig, zero_latency_profile
from lbbench.profiles import load_profile


def poisson_requests(n: int, rate_per_s: float, seed: int = 0, prompt=(16, 256), output=(4, 48),
                     start_s: float = 0.0) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = start_s + np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    return [Request(i, float(arrivals[i]), int(rng.integers(*prompt)), int(rng.integers(*output)))
            for i in range(n)]


@pytest.fixture
def make_requests():
    """``make_requests(n, rate_per_s, seed=..., prompt=(lo, hi), output=(lo, hi))``."""
    return poisson_requests


@pytest.fixture(scope="module")
def a100_fleet():
    with EmulatorFleet(FleetConfig(load_profile("llama3.1-8b-a100-v0"), 2)) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def zero_fleet():
    with EmulatorFleet(FleetConfig(zero_latency_profile(), 2)) as fleet:
        yield fleet
