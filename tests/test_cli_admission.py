"""``lbbench run --admission --tenants`` end to end: shed requests are rows of requests.parquet with their status,
tenant and band; the summary counts them (failed, shed, admitted load) and says when routers were compared at
different admitted loads, and so does ``lbbench report``; ``--from`` repeats the run; bad specs are one line naming the flag, exit code 2."""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main

ARGS = ["run", "--profile", "llama3.1-8b-a100", "--instances", "2", "--workload", "paper-mix", "--rate", "60",
        "--requests", "300", "--router", "round_robin,least_requests", "--timeline-interval", "0",
        "--admission", "max_queue=8,max_outstanding=16", "--tenants", "gold:1@1,std@3", "--slo", "ttft=2"]


def test_admission_end_to_end(tmp_path):
    out = tmp_path / "r"
    res = CliRunner().invoke(main, [*ARGS, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "flow control: admitted load round_robin" in res.output
    df = pl.read_parquet(out / "requests.parquet")
    assert df.height == 600  # 300 per router: nothing dropped
    shed = df.filter(pl.col("http_status").is_not_null())
    assert shed.height > 0
    assert set(shed["http_status"].unique()) <= {429, 503}
    assert (shed["instance"] == -1).all() and shed["error"].str.starts_with("shed by flow control").all()
    assert set(df["tenant"].unique()) == {"gold", "std"}
    assert (df.filter(pl.col("tenant") == "gold")["priority_band"] == 1).all()
    # the higher band is shed less (a smaller share of its requests)
    share = {t: g.filter(pl.col("http_status").is_not_null()).height / g.height
             for (t,), g in df.group_by("tenant")}
    assert share["gold"] < share["std"]
    summary = {r["router"]: r for r in pl.read_parquet(out / "summary.parquet").to_dicts()}
    for router, row in summary.items():
        n_shed = shed.filter(pl.col("router") == router).height
        assert row["shed"] == n_shed and row["failed"] >= n_shed
        span = df.filter(pl.col("router") == router)["arrival_s"]
        assert row["admitted_rate_per_s"] == pytest.approx((300 - n_shed) / (span.max() - span.min()))
        assert row["slo_attainment"] <= (300 - n_shed) / 300  # a shed request is a miss
    rep = CliRunner().invoke(main, ["report", str(out), "--format", "markdown"])
    assert rep.exit_code == 0, rep.output
    assert "warning: flow control: admitted load round_robin" in rep.output
    again = CliRunner().invoke(main, ["run", "--from", str(out), "--out", str(tmp_path / "again"),
                                      "--format", "json"])
    assert again.exit_code == 0, again.output
    rows = {r["router"]: r for r in json.loads(again.stdout)}
    assert {k: rows[k]["shed"] for k in rows} == {k: summary[k]["shed"] for k in summary}


@pytest.mark.parametrize("flag, value, says", [
    ("--admission", "max_queue=-1", "--admission: max_queue=-1 must be >= 0"),
    ("--admission", "max_outstanding=4", "--admission: give max_queue=N"),
    ("--tenants", "gold:high", "--tenants: 'gold:high': priority 'high' is not an integer"),
])
def test_bad_flow_control_specs_are_one_line(tmp_path, flag, value, says):
    res = CliRunner().invoke(main, ["run", "--requests", "5", flag, value, "--out", str(tmp_path / "r")])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: {says}"), res.output
