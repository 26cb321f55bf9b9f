"""The saturation detector on synthetic backlogs, a live step far over capacity, the simulator's mark."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.live.saturation import SaturationDetector, backlog_at, backlog_samples, saturated_at, slope


def series(fn, duration_s=30.0, dt=0.25):
    return [(k * dt, fn(k * dt)) for k in range(int(duration_s / dt) + 1)]


def test_slope_of_a_line():
    assert slope([(t, 3 * t + 1) for t in range(10)]) == pytest.approx(3.0)


def test_steady_backlog_is_not_saturated():
    rng = np.random.default_rng(0)
    assert saturated_at(series(lambda t: 20 + rng.integers(-3, 4)), threshold_per_s=1.0, window_s=5) is None


def test_linear_growth_above_threshold_saturates_after_one_window():
    at = saturated_at(series(lambda t: 0 if t < 10 else 4 * (t - 10)), threshold_per_s=2.0, window_s=5)
    assert at is not None and 10 + 5 * 0.5 <= at <= 10 + 5 + 0.5


def test_growth_below_threshold_is_not_saturated():
    assert saturated_at(series(lambda t: 0.5 * t), threshold_per_s=1.0, window_s=5) is None


def test_burst_that_drains_is_not_saturated():
    def burst(t):  # 60 requests pile up within 2 s, then drain over 3 s
        if 10 <= t < 12:
            return 30 * (t - 10)
        if 12 <= t < 15:
            return 60 - 20 * (t - 12)
        return 0
    assert saturated_at(series(burst), threshold_per_s=2.0, window_s=5) is None


def test_noisy_growth_saturates():
    rng = np.random.default_rng(1)
    at = saturated_at(series(lambda t: max(0.0, 3 * t + rng.normal(0, 6))), threshold_per_s=1.0, window_s=5)
    assert at is not None and at <= 15


def test_young_run_is_never_saturated():
    det = SaturationDetector(1.0, window_s=5)
    assert not any(det.add(t, 100 * t) for t in np.arange(0, 4.9, 0.1))
    assert det.add(5.0, 500) and det.saturated_at_s == 5.0 and det.slope_per_s > 1


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_threshold_must_be_positive(bad):
    with pytest.raises(ValueError, match="must be > 0"):
        SaturationDetector(bad)


@settings(max_examples=40, deadline=None)
@given(rate=st.floats(0.0, 50.0), level=st.integers(0, 200), noise=st.floats(0.0, 2.0), seed=st.integers(0, 99))
def test_property_flat_never_saturates_and_steep_growth_does(rate, level, noise, seed):
    rng = np.random.default_rng(seed)
    flat = series(lambda t: level + rng.normal(0, noise))
    assert saturated_at(flat, threshold_per_s=2.0, window_s=5) is None
    grow = series(lambda t: level + (10 + rate) * t + rng.normal(0, noise))
    assert saturated_at(grow, threshold_per_s=2.0, window_s=5) is not None


def test_backlog_samples_count_arrived_not_ended():
    s = backlog_samples([0.0, 1.0, 2.0], [1.5, 3.0, 5.0], 1.0, until_s=3.0)
    assert s == [(0.0, 1.0), (1.0, 2.0), (2.0, 2.0), (3.0, 1.0)]
    # at any times, in any order; an end of None or inf never comes
    assert backlog_at([0.0, 1.0, 2.0], [1.5, None, float("inf")], [2.5, -1.0, 1.0, 1.5]) == [2, 0, 2, 1]


# -- a live step far over capacity ----------------------------------------------------------------------------

from dataclasses import replace  # noqa: E402

import polars as pl  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from lbbench.cli import main  # noqa: E402
from lbbench.core import Request  # noqa: E402
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig, zero_latency_profile  # noqa: E402
from lbbench.experiment import RunConfig  # noqa: E402
from lbbench.experiment.runner import run_experiment  # noqa: E402
from lbbench.harness.replay import CANCELLED, NOT_SENT, ReplaySettings, run_replay  # noqa: E402
from lbbench.live.saturation import SaturationPolicy  # noqa: E402
from lbbench.routers import get_router  # noqa: E402


@pytest.fixture(scope="module")
def slow_fleet():
    """Two emulated instances of 2 sequences each, 20 ms a step: about 18 requests/s of 10 tokens."""
    prof = replace(zero_latency_profile(), base_s=0.02, max_num_seqs=2)
    with EmulatorFleet(FleetConfig(prof, 2)) as f:
        yield f


@pytest.mark.parametrize("mode", ["cancel", "drain"])
def test_live_step_over_capacity_stops_and_records_every_request(slow_fleet, mode):
    n, rate = 400, 200.0  # about 10 x capacity, 2 s of arrivals
    reqs = [Request(i, i / rate, 16, 10) for i in range(n)]
    res = run_replay(reqs, get_router("round_robin", num_instances=2), slow_fleet.endpoints,
                     ReplaySettings(run_id="t", seed=0, scrape_interval_s=None,
                                    saturation=SaturationPolicy(20.0, 0.5, True, mode)))
    assert res.complete and res.saturated_at_s is not None and res.saturated_at_s < 1.5
    ids = sorted(r.request_id for r in res.records)
    assert ids == list(range(n))  # every request has its one record
    errors = [r.error for r in res.records]
    unsent = errors.count(NOT_SENT)
    assert unsent > n / 4  # stopped early
    assert all(r.actual_send_s is None and r.instance == -1 for r in res.records if r.error == NOT_SENT)
    if mode == "cancel":
        assert errors.count(CANCELLED) > 0
    else:
        assert CANCELLED not in errors


def test_live_step_marks_without_stopping(slow_fleet):
    reqs = [Request(i, i / 100.0, 16, 10) for i in range(150)]
    res = run_replay(reqs, get_router("round_robin", num_instances=2), slow_fleet.endpoints,
                     ReplaySettings(run_id="t", seed=0, scrape_interval_s=None,
                                    saturation=SaturationPolicy(10.0, 0.5, False, "cancel")))
    assert res.saturated_at_s is not None
    assert all(r.error is None for r in res.records) and len(res.records) == 150


def test_simulator_marks_the_overloaded_step(tmp_path):
    base = dict(profile="llama2-7b-v100", instances=1, workload="poisson", prompt_tokens="128",
                output_tokens="128", routers=["round_robin"], timeline_interval_s=None, saturation_window_s=5.0)
    over = run_experiment(RunConfig(rate_per_s=60.0, requests=1200, **base), tmp_path / "over")
    df = pl.read_parquet(tmp_path / "over" / "requests.parquet")
    assert df["saturated"].all() and df["saturated_at_s"][0] is not None
    assert over.summary["saturated"].to_list() == [True]
    calm = run_experiment(RunConfig(rate_per_s=0.5, requests=30, **base), tmp_path / "calm")
    assert not pl.read_parquet(tmp_path / "calm" / "requests.parquet")["saturated"].any()
    assert "saturated" not in calm.summary.columns


@pytest.mark.parametrize("value", ["0", "-2"])
def test_bad_threshold_is_one_line_exit_2(value, tmp_path):
    res = CliRunner().invoke(main, ["run", "--requests", "5", "--saturation-threshold", value,
                                    "--out", str(tmp_path)])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--saturation-threshold" in lines[0] and "> 0" in lines[0], res.output


def test_a_stable_mixed_fleet_is_not_marked_saturated(tmp_path):
    """A light Poisson load on a mixed fleet (the L4s' long requests overlap by chance) is not overload: with the
    defaults its backlog's chance rise (6 to 16 requests) once marked the step saturated."""
    cfg = RunConfig(fleet="llama3.1-8b-a100-v0:2,llama3.1-8b-l4-v0:2", workload="poisson", prompt_tokens="256:0.8",
                    output_tokens="48:0.8", rate_per_s=4.0, requests=240,
                    routers=["round_robin", "least_work_speed"], timeline_interval_s=None)
    run_experiment(cfg, tmp_path / "calm")
    assert not pl.read_parquet(tmp_path / "calm" / "requests.parquet")["saturated"].any()
