"""Generic Poisson workload with fixed or lognormal lengths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.workloads import WorkloadError, parse_length_spec, poisson

length_specs = st.one_of(st.integers(1, 5000),
                         st.tuples(st.floats(1.0, 5000.0), st.floats(0.0, 4.0)))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 300), rate=st.floats(0.1, 1000), seed=st.integers(0, 2**31),
       p=length_specs, o=length_specs)
def test_requests_well_formed(n, rate, seed, p, o):
    reqs = poisson(n, rate, seed, prompt_tokens=p, output_tokens=o)
    assert [r.request_id for r in reqs] == list(range(n))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in reqs)
    if isinstance(p, int):
        assert all(r.prompt_tokens == p for r in reqs)


def test_lognormal_mean_and_cv():
    reqs = poisson(50_000, 100.0, 0, prompt_tokens=(500.0, 1.5), output_tokens=(100.0, 0.5))
    p = np.array([r.prompt_tokens for r in reqs], dtype=float)
    o = np.array([r.output_tokens for r in reqs], dtype=float)
    assert p.mean() == pytest.approx(500, rel=0.04)
    assert p.std() / p.mean() == pytest.approx(1.5, rel=0.15)
    assert o.mean() == pytest.approx(100, rel=0.02)
    assert o.std() / o.mean() == pytest.approx(0.5, rel=0.05)


def test_parse_length_spec():
    assert parse_length_spec("128") == 128
    assert parse_length_spec("200:1.5") == (200.0, 1.5)
    for bad in ("x", "0", "1:2:3", "-5:1", "100:-1"):
        with pytest.raises(WorkloadError, match="prompt"):
            parse_length_spec(bad, "prompt")
