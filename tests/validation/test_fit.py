"""Calibration: the loss, and that a fit recovers a factor from rows the simulator itself produced."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import shared_prefix_row
from lbbench.distributed import SerialExecutor
from lbbench.roofline import RooflineEfficiency
from lbbench.validation.fit import FitResult, cross_validate, fit, loss_of
from lbbench.validation.simulate import simulate_rows

import polars as pl


def test_loss_is_the_mean_absolute_log_ratio():
    f = pl.DataFrame({"metric": ["e2e_mean_ms", "ttft_mean_ms", "tpot_p99_ms"], "measured": [100.0, 10.0, 5.0],
                      "predicted": [200.0, 5.0, 50.0]})
    # |log 2| and |log 0.5| (the TPOT percentile is not in the loss): ln 2
    assert loss_of(f) == pytest.approx(0.6931472, rel=1e-6)


def _as_measured(frame: pl.DataFrame, base: dict) -> list[dict]:
    """Rows whose measured values are a simulation's predictions."""
    rows = []
    for (stage,), part in frame.group_by("stage", maintain_order=True):
        row = shared_prefix_row(**{k: v for k, v in base.items()}, stage=str(stage))
        for metric, pred in part.select("metric", "predicted").iter_rows():
            row[metric] = f"{pred:.6f}"
        rows.append(row)
    return rows


def test_fit_recovers_the_weight_bandwidth_use():
    truth = replace(RooflineEfficiency(), weight_bw_util=0.8)
    base = {"rate_rps": "4", "duration_s": "15", "requests": "60"}
    synthetic = simulate_rows([shared_prefix_row(**base)], truth, api_overhead_s=0.01, executor=SerialExecutor())
    rows = _as_measured(synthetic, base)
    start = replace(truth, weight_bw_util=0.5)
    res = fit(rows, start, api_overhead_s=0.01, params=["weight_bw_util"], rounds=1, steps=12,
              executor=SerialExecutor())
    assert res.eff.weight_bw_util == pytest.approx(0.8, rel=0.02)
    assert res.loss < 0.01 and res.history[0]["loss"] > res.loss


def test_cross_validation_refits_only_the_factors_given():
    """Two experiments made by the simulator at weight_bw_util 0.8, the start at 0.5: holding one out, the fit on
    the other recovers 0.8 for the factor given and leaves the others as they started."""
    truth = replace(RooflineEfficiency(), weight_bw_util=0.8)
    rows = []
    for i, rate in enumerate(("4", "6")):
        base = {"rate_rps": rate, "duration_s": "15", "requests": str(15 * int(rate)), "id": f"exp-{i}"}
        synthetic = simulate_rows([shared_prefix_row(**base)], truth, api_overhead_s=0.01, executor=SerialExecutor())
        rows += _as_measured(synthetic, base)
    start = replace(truth, weight_bw_util=0.5, step_overhead_s=0.002)
    none = fit(rows, start, api_overhead_s=0.01, rounds=0, executor=SerialExecutor())  # rounds 0: the start
    assert none.eff == start and len(none.history) == 1
    held = cross_validate(rows, FitResult(start, 0.01, none.loss), by="id", params=["weight_bw_util"],
                          executor=SerialExecutor())
    assert sorted(held["held_out"].unique()) == ["id=exp-0", "id=exp-1"]
    e2e = held.filter(pl.col("metric") == "e2e_mean_ms")
    # fitted on the other experiment, each held-out experiment is predicted as the truth made it
    assert ((e2e["predicted"] / e2e["measured"] - 1).abs() < 0.03).all()
