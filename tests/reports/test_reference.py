"""The strongest baseline: chosen per context among baseline routers x instance schedulers, gains paired by seed."""

import polars as pl
import pytest

from lbbench.metrics.reference import against_best_baseline, with_reference
from lbbench.metrics.summary import Slo, summarize


def _rows(router, sched, rate, seed, e2es):
    return [{"router": router, "instance_scheduler": sched, "rate_per_s": rate, "seed": seed, "request_id": k,
             "arrival_s": 0.0, "dispatch_s": 0.0, "first_token_s": 0.5, "finish_s": e, "generated_tokens": 10,
             "error": None} for k, e in enumerate(e2es)]


def _frame():
    rows = []
    # rate 1: jsq/priority is the best baseline (mean 4 and 6 over seeds 0 and 1); rate 2: round_robin/fcfs
    for seed, (rr_f, rr_p, jsq_p, new) in enumerate([((10, 10), (6, 6), (4, 4), (2, 2)),
                                                      ((10, 10), (8, 8), (6, 6), (6, 6))]):
        rows += _rows("round_robin", "fcfs", 1.0, seed, rr_f) + _rows("round_robin", "priority", 1.0, seed, rr_p)
        rows += _rows("jsq", "priority", 1.0, seed, jsq_p) + _rows("mine", "fcfs", 1.0, seed, new)
        rows += _rows("round_robin", "fcfs", 2.0, seed, (3, 3)) + _rows("jsq", "priority", 2.0, seed, (5, 5))
        rows += _rows("mine", "fcfs", 2.0, seed, (6, 6))
    return pl.DataFrame(rows)


def test_reference_is_the_best_baseline_combination_per_context_and_gains_are_paired():
    df = _frame()
    by = ["router", "instance_scheduler", "rate_per_s"]
    ref = {(r["router"], r["instance_scheduler"], r["rate_per_s"]): r for r in against_best_baseline(df, by).to_dicts()}
    mine1 = ref[("mine", "fcfs", 1.0)]
    assert mine1["best_baseline"] == "jsq/priority"
    # per seed: (4 - 2) / 4 = 50 %, (6 - 6) / 6 = 0 %; mean 25 %
    assert mine1["vs_best_baseline_pct"] == pytest.approx(25.0)
    assert ref[("jsq", "priority", 1.0)]["vs_best_baseline_pct"] == 0
    mine2 = ref[("mine", "fcfs", 2.0)]
    assert mine2["best_baseline"] == "round_robin/fcfs"
    assert mine2["vs_best_baseline_pct"] == pytest.approx(-100.0)  # 6 s against 3 s
    # goodput with an E2E limit of 5 s: seed 0, mine 2 met in a 2 s makespan (1/s) against jsq's 2 in 4 s
    # (0.5/s): +100 %; seed 1, jsq met none (6 s each), so that seed's gain is undefined and left out
    slo_ref = against_best_baseline(df, by, Slo(e2e_s=5.0)).filter(
        (pl.col("router") == "mine") & (pl.col("rate_per_s") == 1.0))
    assert slo_ref["goodput_vs_best_baseline_pct"][0] == pytest.approx(100.0)


def test_with_reference_keeps_the_summary_rows_and_handles_no_baseline():
    df = _frame()
    by = ["router", "instance_scheduler", "rate_per_s"]
    s = with_reference(summarize(df, by=by), df, by)
    assert s.height == summarize(df, by=by).height
    assert {"best_baseline", "vs_best_baseline_pct", "p99_vs_best_baseline_pct"} <= set(s.columns)
    alone = df.filter(pl.col("router") == "mine")
    out = against_best_baseline(alone, by)
    assert out["best_baseline"].null_count() == out.height
