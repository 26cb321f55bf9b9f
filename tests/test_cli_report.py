"""`lbbench report` / `lbbench compare` through click: formats, files, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.cli.report import parse_slo
from lbbench.reports.synthetic import synthetic_requests, write_run

DATA = Path(__file__).resolve().parent / "reports" / "data"
V100, A100, LIVE = DATA / "v100", DATA / "a100", DATA / "live"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_report_markdown_paper_tables(runner):
    res = runner.invoke(main, ["report", str(V100), "--format", "markdown", "--bootstrap", "200"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "## Mean end-to-end latency by router" in out
    assert "| round_robin |" in out and "| jsq |" in out and "| random |" in out
    assert "improvement vs round_robin (%) [95% CI]" in out and "±" in out
    assert "## Latency detail" in out and "## Per-instance share of requests and tokens" in out


def test_report_two_profiles_side_by_side(runner):
    res = runner.invoke(main, ["report", str(V100), str(A100), "--format", "markdown", "--bootstrap", "200"])
    assert res.exit_code == 0, res.output
    assert "## Side by side by profile" in res.output
    assert "llama2-7b-v100: mean E2E (s)" in res.output
    assert "llama3.1-8b-a100: mean E2E (s)" in res.output  # the recorded run's profile name


def test_report_json_and_slo(runner):
    res = runner.invoke(main, ["report", str(LIVE), "--format", "json", "--slo", "ttft=2,tbt=0.05,e2e=20",
                                 "--bootstrap", "200"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc["tables"]) >= {"main", "latency", "live", "goodput"}
    live = {r["router"]: r for r in doc["tables"]["live"]}
    assert live["jsq"]["failed"] == 4 and live["jsq"]["dispatch_lag_p99_s"] > 0
    assert all(0 <= r["goodput_pct"] <= 100 for r in doc["tables"]["goodput"])


def test_report_table_to_file(runner, tmp_path):
    out = tmp_path / "r.txt"
    res = runner.invoke(main, ["report", str(V100), "--out", str(out), "--bootstrap", "200"])
    assert res.exit_code == 0, res.output
    assert "Mean end-to-end latency by router" in out.read_text()


def test_report_html_default_location(runner, tmp_path):
    run = write_run(tmp_path / "run", synthetic_requests(num_requests=40, seeds=(0,)))
    res = runner.invoke(main, ["report", str(run), "--format", "html", "--bootstrap", "100"])
    assert res.exit_code == 0, res.output
    page = (run / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page


@pytest.mark.parametrize("args,needle", [
    (["--slo", "ttft=fast"], "--slo"),
    (["--slo", "latency=3"], "--slo"),
    (["--format", "pdf"], "--format"),
])
def test_report_bad_flags_exit_2(runner, args, needle):
    res = runner.invoke(main, ["report", str(V100), *args])
    assert res.exit_code == 2
    assert needle in res.output


def test_report_bad_dir_one_line_exit_2(runner, tmp_path):
    res = runner.invoke(main, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "nope" in res.output


def test_parse_slo():
    slo = parse_slo("ttft=0.5, tbt=0.1,e2e=30")
    assert (slo.ttft_s, slo.tbt_s, slo.e2e_s) == (0.5, 0.1, 30.0)
    assert parse_slo(None) is None


def _pair(tmp_path, slowdown, cand_seeds=(0, 1)):
    a = write_run(tmp_path / "base", synthetic_requests(routers=("jsq",), num_requests=150,
                                                        seeds=(0, 1), slowdown={"jsq": 1.0}))
    b = write_run(tmp_path / "cand", synthetic_requests(routers=("jsq",), num_requests=150,
                                                        seeds=cand_seeds,
                                                        slowdown={"jsq": slowdown}))
    return a, b


def test_compare_exit_codes(runner, tmp_path):
    a, b = _pair(tmp_path, 1.0, cand_seeds=(5, 6))  # same configuration, other seeds
    ok = runner.invoke(main, ["compare", str(a), str(b), "--bootstrap", "200"])
    assert ok.exit_code == 0, ok.output
    assert ok.output.rstrip().splitlines()[-1].startswith("OK")
    a, b = _pair(tmp_path, 1.3)
    bad = runner.invoke(main, ["compare", str(a), str(b), "--bootstrap", "200", "--max-regression", "5%"])
    assert bad.exit_code == 1
    assert "REGRESSION" in bad.output
    loose = runner.invoke(main, ["compare", str(a), str(b), "--bootstrap", "200", "--max-regression", "80%"])
    assert loose.exit_code == 0


def test_compare_json_and_metric(runner, tmp_path):
    a, b = _pair(tmp_path, 1.3)
    res = runner.invoke(main, ["compare", str(a), str(b), "--format", "json", "--metric", "p90_e2e_s",
                                  "--bootstrap", "200"])
    assert res.exit_code == 1
    doc = json.loads(res.output)
    assert doc["regressed"] and [r["metric"] for r in doc["rows"]] == ["p90_e2e_s"]


@pytest.mark.parametrize("args,needle", [
    (["--pair", "jsq"], "--pair"),
    (["--pair", "nope=jsq"], "--pair"),
    (["--metric", "speed"], "--metric"),
    (["--max-regression", "x"], "--max-regression"),
])
def test_compare_bad_flags_exit_2(runner, tmp_path, args, needle):
    a, b = _pair(tmp_path, 1.0)
    res = runner.invoke(main, ["compare", str(a), str(b), *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output


def test_compare_missing_run_exit_2(runner, tmp_path):
    res = runner.invoke(main, ["compare", str(V100), str(tmp_path / "missing")])
    assert res.exit_code == 2 and "missing" in res.output


def test_report_writes_plot_files(runner, tmp_path):
    res = runner.invoke(main, ["report", str(V100), "--format", "json", "--plots", str(tmp_path / "png"),
                                 "--bootstrap", "100"])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert names == ["e2e_cdf.png", "e2e_over_time.png", "improvement.png", "load_v100.png",
                     "ttft_cdf.png"]
    assert all((tmp_path / "png" / n).read_bytes().startswith(b"\x89PNG") for n in names)
