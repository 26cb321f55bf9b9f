"""summarize/derive: hand-computed values, pairing, live columns, invariants."""

from __future__ import annotations

import math

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.core import RECORD_FIELDS
from lbbench.metrics.summary import (METRIC_COLUMNS, SummaryError, derive, summarize,
                                     summary_records)
from lbbench.reports.synthetic import synthetic_requests


def _rec(router, seed, rid, arrival, dispatch, first, finish, gen=10, pre=0, tbt=0.1, error=None,
         **kw):
    row = {f: None for f in RECORD_FIELDS}
    row.update(run_id="r", router=router, seed=seed, request_id=rid, task="t", instance=rid % 2,
               arrival_s=arrival, dispatch_s=dispatch, first_token_s=first, finish_s=finish,
               prompt_tokens=5, output_tokens=gen, generated_tokens=gen, num_preemptions=pre,
               tbt_mean_s=tbt, tbt_p99_s=tbt and 2 * tbt, tbt_max_s=tbt and 3 * tbt,
               error=error)
    row.update(kw)
    return row


def _frame(rows):
    return pl.DataFrame(rows, infer_schema_length=None)


def test_derive_columns():
    lf = derive(_frame([_rec("a", 0, 0, 1.0, 1.5, 2.0, 5.0, planned_send_s=1.0,
                             actual_send_s=1.25)]))
    row = lf.collect().row(0, named=True)
    assert row["router_wait_s"] == 0.5
    assert row["ttft_s"] == 1.0
    assert row["e2e_s"] == 4.0
    assert row["dispatch_lag_s"] == 0.25


def test_hand_computed_two_seeds():
    rows = [
        # seed 0: rr e2e 2, 4 -> mean 3 ; jsq e2e 1, 2 -> mean 1.5
        _rec("round_robin", 0, 0, 0.0, 0.0, 1.0, 2.0, pre=1),
        _rec("round_robin", 0, 1, 1.0, 1.0, 2.0, 5.0),
        _rec("jsq", 0, 0, 0.0, 0.0, 0.5, 1.0),
        _rec("jsq", 0, 1, 1.0, 1.5, 2.0, 3.0),
        # seed 1: rr e2e 4, 4 -> mean 4 ; jsq e2e 2, and one failure -> mean 2
        _rec("round_robin", 1, 0, 0.0, 0.0, 1.0, 4.0),
        _rec("round_robin", 1, 1, 1.0, 1.0, 2.0, 5.0, pre=2),
        _rec("jsq", 1, 0, 0.0, 0.0, 1.0, 2.0),
        _rec("jsq", 1, 1, 1.0, 1.0, None, None, error="boom"),
    ]
    s = summarize(_frame(rows))
    assert s.columns == ["router", *METRIC_COLUMNS]
    assert s["router"].to_list() == ["round_robin", "jsq"]  # first-appearance order
    rr, jsq = s.row(0, named=True), s.row(1, named=True)
    assert rr["seeds"] == 2 and jsq["seeds"] == 2
    assert rr["mean_e2e_s"] == pytest.approx(3.5)
    assert rr["mean_e2e_std_s"] == pytest.approx(math.sqrt(0.5))
    assert jsq["mean_e2e_s"] == pytest.approx(1.75)
    # paired: seed0 100*(3-1.5)/3 = 50 ; seed1 100*(4-2)/4 = 50
    assert jsq["improvement_vs_round_robin_pct"] == pytest.approx(50.0)
    assert jsq["improvement_vs_round_robin_s"] == pytest.approx(1.75)
    assert rr["improvement_vs_round_robin_pct"] == 0.0
    assert rr["preemptions"] == pytest.approx(1.5)
    assert jsq["completed"] == 3 and jsq["failed"] == 1
    assert rr["completed"] == 4 and rr["failed"] == 0
    # jsq router wait: seed0 (0+0.5)/2=0.25, seed1 0 -> 0.125
    assert jsq["mean_router_wait_s"] == pytest.approx(0.125)
    # throughput rr: seed0 20 tokens / 5 s = 4, seed1 20/5 = 4
    assert rr["throughput_tokens_per_s"] == pytest.approx(4.0)
    assert rr["max_tbt_s"] == pytest.approx(0.3)
    assert rr["dispatch_lag_p50_s"] is None and rr["achieved_rate_per_s"] is None


def test_single_seed_std_zero_and_no_baseline_null():
    rows = [_rec("jsq", 3, 0, 0.0, 0.0, 1.0, 2.0), _rec("jsq", 3, 1, 0.5, 0.5, 1.0, 3.0)]
    row = summarize(_frame(rows)).row(0, named=True)
    assert row["mean_e2e_std_s"] == 0.0
    assert row["improvement_vs_round_robin_pct"] is None


def test_pairing_respects_other_group_keys():
    df = pl.concat([
        synthetic_requests(routers=("round_robin", "jsq"), seeds=(0,), num_requests=50,
                           chunked_prefill=flag)
        for flag in (False, True)
    ])
    s = summarize(df, by=("router", "chunked_prefill"))
    assert s.height == 4
    assert s.filter(pl.col("router") == "round_robin")["improvement_vs_round_robin_pct"].to_list() \
        == [0.0, 0.0]


def test_other_baseline_renames_columns():
    s = summarize(synthetic_requests(num_requests=30, seeds=(0,)), baseline="jsq")
    assert "improvement_vs_jsq_pct" in s.columns
    assert s.filter(pl.col("router") == "jsq")["improvement_vs_jsq_pct"].item() == 0.0


def test_live_columns():
    df = synthetic_requests(routers=("round_robin",), seeds=(0,), num_requests=100, live=True,
                            fail_every=10)
    row = summary_records(df)[0]
    assert row["failed"] == 10 and row["completed"] == 90
    assert 0 <= row["dispatch_lag_p50_s"] <= row["dispatch_lag_p99_s"] < 0.01
    assert row["achieved_rate_per_s"] == pytest.approx(row["requested_rate_per_s"], rel=0.01)


def test_missing_column_is_clear():
    with pytest.raises(SummaryError, match="router"):
        summarize(pl.DataFrame({"seed": [0]}))


def test_lazy_input_and_all_null_optionals():
    rows = [_rec("a", 0, 0, 0.0, 0.0, 1.0, 2.0, tbt=None, pre=None)]
    row = summarize(_frame(rows).lazy()).row(0, named=True)
    assert row["mean_tbt_s"] is None and row["mean_e2e_s"] == 2.0


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(5, 40), st.integers(0, 10_000))
def test_invariants(num_seeds, num_requests, seed0):
    df = synthetic_requests(routers=("round_robin", "random"), seeds=range(seed0, seed0 + num_seeds),
                            num_requests=num_requests, fail_every=7)
    s = summarize(df)
    for row in s.iter_rows(named=True):
        assert row["seeds"] == num_seeds
        assert row["completed"] + row["failed"] == num_seeds * num_requests
        assert row["p50_e2e_s"] <= row["p90_e2e_s"] <= row["p99_e2e_s"]
        assert row["mean_ttft_s"] <= row["mean_e2e_s"]
        assert row["mean_e2e_std_s"] >= 0
    assert s.filter(pl.col("router") == "round_robin")["improvement_vs_round_robin_pct"].item() == 0
