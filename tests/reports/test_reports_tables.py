"""Report tables: grouping from the data, shares, goodput, side-by-side layout, rendering."""

from __future__ import annotations

import json

import polars as pl
import pytest

from lbbench.rundir import RunDirError, group_keys, load_runs
from lbbench.reports.report import build_report
from lbbench.reports.synthetic import synthetic_requests, write_run
from lbbench.reports.tables import Slo, balance_table, goodput_table, hardware_table


def test_group_keys_follow_varying_settings(tmp_path):
    write_run(tmp_path / "off", synthetic_requests(num_requests=20, seeds=(0,)))
    write_run(tmp_path / "on", synthetic_requests(num_requests=20, seeds=(0,), chunked_prefill=True))
    runs = load_runs([tmp_path])  # parent directory: finds both runs
    assert [i.label for i in runs.infos] == ["off", "on"]
    assert runs.group_keys() == ["router", "chunked_prefill"]
    rep = build_report([tmp_path], num_resamples=100)
    assert "A100 form" in rep.table("main").title
    assert rep.table("main").df.height == 6
    side = rep.table("by_chunked_prefill").df
    assert side.height == 3
    assert "chunked prefill off | mean_e2e_s" in side.columns
    assert "chunked prefill on | mean_e2e_s" in side.columns


def test_same_settings_same_seeds_group_by_run(tmp_path):
    df = synthetic_requests(num_requests=20, seeds=(0,))
    write_run(tmp_path / "a", df)
    write_run(tmp_path / "b", df)
    assert group_keys(load_runs([tmp_path / "a", tmp_path / "b"]).requests)[-1] == "run"


def test_same_settings_other_seeds_pool(tmp_path):
    write_run(tmp_path / "a", synthetic_requests(num_requests=20, seeds=(0,)))
    write_run(tmp_path / "b", synthetic_requests(num_requests=20, seeds=(1,)))
    rep = build_report([tmp_path / "a", tmp_path / "b"], num_resamples=100)
    assert rep.keys == ["router"]
    assert rep.table("main").df["seeds"].to_list() == [2, 2, 2]


def test_balance_shares_sum_to_100(v100_run):
    lf = load_runs([v100_run]).requests
    df = balance_table(lf, ["router"]).df
    sums = df.group_by("router").agg(pl.col("requests_share_pct").sum(), pl.col("tokens_share_pct").sum())
    for row in sums.iter_rows(named=True):
        assert row["requests_share_pct"] == pytest.approx(100)
        assert row["tokens_share_pct"] == pytest.approx(100)
    rr = df.filter(pl.col("router") == "round_robin")["requests_share_pct"].to_list()
    assert rr == pytest.approx([25.0] * 4)  # round robin spreads requests evenly


def test_goodput_monotone_in_slo(v100_run):
    lf = load_runs([v100_run]).requests
    tight = goodput_table(lf, ["router"], Slo(e2e_s=5.0)).df["goodput_pct"].to_list()
    loose = goodput_table(lf, ["router"], Slo(e2e_s=50.0)).df["goodput_pct"].to_list()
    none = goodput_table(lf, ["router"], Slo()).df["goodput_pct"].to_list()
    assert all(t <= l_ <= n for t, l_, n in zip(tight, loose, none))
    assert none == pytest.approx([100.0] * 3)


def test_hardware_side_by_side(v100_run, a100_run):
    rep = build_report([v100_run, a100_run], num_resamples=100)
    hw = rep.table("hardware").df
    assert hw["router"].to_list() == ["round_robin", "jsq", "random"]
    assert "llama2-7b-v100 | mean_e2e_s" in hw.columns
    assert "llama3.1-8b-a100 | mean_e2e_s" in hw.columns
    assert hardware_table(rep.table("latency").df, ["router"]) is None


def test_live_table_only_for_live_runs(v100_run, live_run):
    assert build_report([v100_run], num_resamples=100).table("live") is None
    live = build_report([live_run], num_resamples=100).table("live").df
    assert live["failed"].to_list() == [4, 4]


def test_render_formats(v100_run):
    rep = build_report([v100_run], num_resamples=100, slo=Slo(ttft_s=1.0))
    md = rep.render("markdown")
    assert "## Mean end-to-end latency by router" in md and "| jsq |" in md
    assert "## Goodput under SLOs" in md
    doc = json.loads(rep.render("json"))
    assert doc["group_keys"] == ["router"]
    assert {r["router"] for r in doc["tables"]["main"]} == {"round_robin", "jsq", "random"}
    text = rep.render("table")
    assert "Latency detail" in text and "round_robin" in text
    with pytest.raises(ValueError, match="^format"):
        rep.render("pdf")


def test_bad_run_dirs(tmp_path):
    with pytest.raises(RunDirError, match="no such run directory"):
        load_runs([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match="no requests.parquet"):
        load_runs([tmp_path / "empty"])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "requests.parquet").write_text("not parquet")
    with pytest.raises(RunDirError, match="requests.parquet"):
        load_runs([bad])
    pl.DataFrame({"x": [1]}).write_parquet(tmp_path / "cols.parquet")
    with pytest.raises(RunDirError, match="missing column"):
        load_runs([tmp_path / "cols.parquet"])


def test_timeline_falls_back_to_live_metrics(tmp_path, v100_run):
    import shutil

    run = tmp_path / "live"
    shutil.copytree(v100_run, run)
    (run / "timeline.parquet").rename(run / "metrics.parquet")
    runs = load_runs([run])
    assert runs.infos[0].timeline_path.name == "metrics.parquet"
    assert runs.timeline().collect().height > 0


def test_summarize_groups_with_null_keys():
    from lbbench.metrics.summary import summarize

    df = pl.concat([
        synthetic_requests(routers=("round_robin", "jsq"), num_requests=30, seeds=(0,)),
        synthetic_requests(routers=("round_robin", "jsq"), num_requests=30, seeds=(0,))
        .with_columns(order=pl.lit("lh_then_hl")),
    ])
    s = summarize(df, by=("router", "order"))
    assert s.height == 4
    assert s["order"].to_list() == [None, None, "lh_then_hl", "lh_then_hl"]
    assert s.filter(pl.col("router") == "round_robin")["improvement_vs_round_robin_pct"].to_list() \
        == [0.0, 0.0]


def test_incomplete_run_is_flagged(tmp_path):
    write_run(tmp_path / "cut", synthetic_requests(num_requests=20, seeds=(0,)), complete=False)
    rep = build_report([tmp_path / "cut"], num_resamples=100)
    assert "[INCOMPLETE]" in rep.preamble()
    assert any("incomplete" in w for w in json.loads(rep.render("json"))["warnings"])
