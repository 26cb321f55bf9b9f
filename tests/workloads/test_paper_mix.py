"""The paper's five-task mix: fitted lengths match Table 1; requests well-formed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.workloads import PAPER_TASKS, check_paper_mix_fit, paper_mix
from lbbench.workloads.lengths import HurdleLength, LognormalLength
from lbbench.workloads.paper_mix import HEAVY_DECODE_TOKENS, MAX_PROMPT_TOKENS, format_fit_check, task_lengths
from lbbench.workloads.errors import WorkloadError

TASK_NAMES = {t.name for t in PAPER_TASKS}


def test_fit_matches_table1_over_200k_draws():
    checks = check_paper_mix_fit(num_samples=200_000, seed=0)
    print(format_fit_check(checks))  # shown with pytest -s
    for c in checks:
        assert c.output_rel_error < 0.015, c
        assert c.prompt_rel_error < 0.015, c
        assert c.heavy_abs_error < 0.005, c
        assert c.max_prompt_tokens <= MAX_PROMPT_TOKENS
        assert c.min_output_tokens >= 1


#: by hand from Table 1: the light part's mean = mean output - heavy share x 250 (the heavy part's mean is 250 more),
#: e.g. translation 61.76 - 0.0918 x 250 = 38.81, and 0.9082 x 38.81 + 0.0918 x 288.81 = 61.76
LIGHT_MEAN_TOKENS = {"translation": 38.81, "eli5": 188.95, "imdb": 40.005, "squad": 100.145, "wnut17": 42.325}


def test_hurdle_moments_are_table1s():
    for t in PAPER_TASKS:
        prompt, output = task_lengths(t.name)
        assert prompt.mean_tokens == pytest.approx(t.mean_prompt_tokens, rel=1e-6)
        assert output.light_mean_tokens == pytest.approx(LIGHT_MEAN_TOKENS[t.name], abs=1e-9)


def test_single_lognormal_cannot_fit_most_tasks():
    """Why the hurdle model: mean m and P(X >= 250) = p have a lognormal solution
    only when z^2 >= 2 ln(250/m) with z the normal quantile of 1 - p (or ln(250/m) < 0)."""
    from statistics import NormalDist

    solvable = []
    for t in PAPER_TASKS:
        z = NormalDist().inv_cdf(1 - t.heavy_share)
        c = math.log(HEAVY_DECODE_TOKENS / t.mean_output_tokens)
        solvable.append(c < 0 or z * z >= 2 * c)
    assert solvable == [False, True, False, False, False]


def test_hurdle_rejects_impossible_targets():
    with pytest.raises(WorkloadError):
        HurdleLength(mean_tokens=50, heavy_share=0.5)  # 0.5 * 250 > 50


def test_lognormal_for_mean_is_exact_after_clipping():
    m = LognormalLength.for_mean(400.0, sigma=1.2, lo=1, hi=1000)
    x = m.sample(np.random.default_rng(0), 400_000)
    assert x.min() >= 1 and x.max() <= 1000
    assert x.mean() == pytest.approx(400.0, rel=0.01)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 400), rate=st.floats(0.1, 500), seed=st.integers(0, 2**32 - 1),
       burst=st.sampled_from([0.5, 1.0, 3.0]))
def test_requests_well_formed(n, rate, seed, burst):
    reqs = paper_mix(n, rate, seed, burstiness=burst)
    assert [r.request_id for r in reqs] == list(range(n))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    for r in reqs:
        assert 1 <= r.prompt_tokens <= MAX_PROMPT_TOKENS
        assert r.output_tokens >= 1
        assert r.task in TASK_NAMES


def test_mix_proportions_and_determinism():
    reqs = paper_mix(20_000, 20.0, seed=5)
    assert reqs == paper_mix(20_000, 20.0, seed=5)
    assert reqs != paper_mix(20_000, 20.0, seed=6)
    total = sum(t.num_samples for t in PAPER_TASKS)
    tasks = [r.task for r in reqs]
    for t in PAPER_TASKS:
        assert tasks.count(t.name) / len(tasks) == pytest.approx(t.num_samples / total, abs=0.015)
    span = reqs[-1].arrival_s
    assert (len(reqs) - 1) / span == pytest.approx(20.0, rel=0.05)


def test_same_seed_same_lengths_at_any_rate():
    slow, fast = paper_mix(500, 1.0, seed=3), paper_mix(500, 50.0, seed=3)
    assert [(r.task, r.prompt_tokens, r.output_tokens) for r in slow] == \
        [(r.task, r.prompt_tokens, r.output_tokens) for r in fast]
    assert slow[-1].arrival_s > fast[-1].arrival_s
