"""``lbbench plan`` end to end through the CLI: rows, prices, outputs, skipped GPUs and bad input (exit 2)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.planning import PRICE_COLUMNS, ROW_COLUMNS

BASE = ["plan", "--workload", "paper-mix", "--rate", "20", "--requests", "300", "--slo", "ttft=2,tbt=0.1",
        "--attainment", "0.95", "--model", "llama-3.1-8b"]


def _invoke(args):
    return CliRunner().invoke(main, args)


@pytest.fixture(scope="module")
def priced(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    prices = d / "prices.toml"
    prices.write_text("[gpu_usd_per_hour]\na100-80gb = 2.0\nl4 = 0.5\n")
    res = _invoke([*BASE, "--gpu", "a100-80gb,l4", "--price-file", str(prices), "--format", "json",
                   "--out", str(d / "out")])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), d / "out"


def test_json_rows_have_the_documented_columns_and_types(priced):
    doc, _ = priced
    assert doc["complete"] is True and [r["gpu"] for r in doc["rows"]] == ["a100-80gb", "l4"]
    for row in doc["rows"]:
        assert list(row) == [*ROW_COLUMNS, *PRICE_COLUMNS]
        assert isinstance(row["instances"], int) and row["instances"] >= 1 and row["tp"] == 1
        assert row["gpus"] == row["instances"] * row["tp"]
        assert row["router"] == "jsq" and isinstance(row["monotone"], bool)
        assert 0.95 <= row["attainment"] <= 1 and 0 <= row["attainment_at_fewer"] < 0.95
        for col in ("goodput_per_s", "mean_e2e_s", "p99_e2e_s", "mean_ttft_s", "p99_ttft_s", "tokens_per_s"):
            assert isinstance(row[col], float) and row[col] > 0
        assert row["p99_e2e_s"] >= row["mean_e2e_s"] and row["p99_ttft_s"] >= row["mean_ttft_s"]
        # the chosen count and the one below are among the plotted points, with the same attainments
        pts = {p["instances"]: p for p in doc["points"] if p["gpu"] == row["gpu"]}
        assert pts[row["instances"]]["chosen"] and pts[row["instances"]]["attainment"] == row["attainment"]
        if row["instances"] > 1:
            assert pts[row["instances"] - 1]["attainment"] == row["attainment_at_fewer"]
    assert doc["rows"][0]["instances"] <= doc["rows"][1]["instances"]  # an A100 does at least what an L4 does
    assert "physics-derived" in doc["what"] and "nothing here was measured" in doc["what"]


def test_price_columns_by_hand(priced):
    doc, _ = priced
    for row, price in zip(doc["rows"], (2.0, 0.5)):
        usd_h = price * row["instances"] * row["tp"]
        assert row["usd_per_hour"] == pytest.approx(usd_h)
        assert row["usd_per_million_tokens"] == pytest.approx(usd_h / (row["tokens_per_s"] * 3600) * 1e6)


def test_out_dir_holds_plan_points_picture_and_html(priced):
    doc, out = priced
    assert json.loads((out / "plan.json").read_text())["rows"] == doc["rows"]
    lines = [json.loads(x) for x in (out / "points.jsonl").read_text().splitlines()]
    assert len(lines) == len(doc["points"])
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (out / "plan.html").read_text()
    assert "data:image/png;base64," in html and "a100-80gb" in html and "USD/h" in html


def test_table_format_and_a_model_that_does_not_fit_is_skipped_with_one_line():
    res = _invoke(["plan", "--workload", "paper-mix", "--rate", "2", "--requests", "100", "--slo", "ttft=5,tbt=0.5",
                   "--attainment", "0.9", "--model", "llama-3.1-70b", "--gpu", "l4,mi300x", "--max-instances", "4"])
    assert res.exit_code == 0, res.output
    skips = [line for line in res.stderr.splitlines() if line.startswith("skipping")]
    assert len(skips) == 1 and "l4 at TP 1" in skips[0] and "does not fit" in skips[0]
    assert "mi300x" in res.stdout and "instances" in res.stdout


@pytest.mark.parametrize("args,flag,problem", [
    (["--slo", "ttft2"], "--slo", "expected ttft=S"),
    (["--slo", "ttft=-1"], "--slo", "must be > 0"),
    (["--gpu", "a100-80gb,nosuch"], "--gpu", "unknown GPU 'nosuch'"),
    (["--attainment", "1.5"], "--attainment", "must be in (0, 1]"),
    (["--attainment", "0"], "--attainment", "must be in (0, 1]"),
    (["--tp", "two"], "--tp", "not a whole number"),
    (["--rate", "-3"], "--rate", "must be > 0"),
    (["--router", "nosuch"], "", "nosuch"),
    (["--model", "nosuch-model"], "", "nosuch-model"),
    (["--price-file", "missing.toml"], "--price-file", "no such file"),
    (["--gpu", "l4", "--max-instances", "1"], "--max-instances", "1 instances are not enough for l4 TP 1"),
    (["--gpu", "l4", "--model", "llama-3.1-70b"], "--gpu", "fits none"),
    (["--tp", "3"], "--gpu", "32 attention heads (8 KV heads) do not split over TP 3"),
])
def test_bad_input_is_one_line_and_exit_2(args, flag, problem):
    opts = dict(zip(BASE[1::2], BASE[2::2]))
    opts["--gpu"] = "a100-80gb"
    for k, v in zip(args[::2], args[1::2]):
        opts[k] = v
    res = _invoke(["plan", *[x for kv in opts.items() for x in kv]])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: {flag}") and problem in lines[0], res.stderr


def test_a_gpu_missing_from_the_price_file_is_one_line(tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text("[gpu_usd_per_hour]\nh100 = 3.0\n")
    res = _invoke([*BASE, "--gpu", "a100-80gb", "--price-file", str(prices)])
    assert res.exit_code == 2 and res.stderr.strip().count("\n") == 0
    assert res.stderr.startswith("Error: --price-file") and "no price for a100-80gb" in res.stderr


def test_a_trace_rescaled_to_the_rate(tmp_path):
    trace = tmp_path / "t.csv"
    rows = "\n".join(f"{0.1 * i:.1f},{200 + 37 * (i % 11)},{20 + 13 * (i % 7)}" for i in range(200))
    trace.write_text("t,p,o\n" + rows + "\n")
    res = _invoke(["plan", "--trace", str(trace), "--mapping", "arrival=t,prompt=p,output=o", "--rate", "30",
                   "--slo", "ttft=1,tbt=0.2", "--attainment", "0.9", "--model", "llama-3.1-8b", "--gpu", "l4",
                   "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["config"]["trace"] == str(trace) and doc["config"]["rate_per_s"] == 30
    (row,) = doc["rows"]
    assert row["completed"] == 200 and row["attainment"] >= 0.9


def test_jobs_and_serial_give_the_same_rows(priced):
    doc, _ = priced
    res = _invoke([*BASE, "--gpu", "a100-80gb,l4", "--jobs", "2", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [{k: v for k, v in r.items() if not k.startswith("usd")} for r in doc["rows"]] == rows


def test_plan_json_cites_each_derived_profile(priced):
    doc, _ = priced
    assert {r["profile"] for r in doc["rows"]} == set(doc["profiles"])
    for prof in doc["profiles"].values():
        assert prof["base_s"] > 0 and prof["kv_capacity_tokens"] > 0
        assert "lbbench profile derive" in prof["source"]["method"]


def test_html_to_stdout_without_out():
    res = _invoke([*BASE, "--requests", "100", "--gpu", "h100", "--format", "html"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("<!DOCTYPE html>") and "data:image/png;base64," in res.stdout
    assert "h100" in res.stdout and "physics-derived" in res.stdout


def test_each_router_gets_its_own_row(tmp_path):
    res = _invoke([*BASE, "--requests", "150", "--gpu", "l4", "--router", "jsq,round_robin", "--format", "json",
                   "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [(r["gpu"], r["router"]) for r in rows] == [("l4", "jsq"), ("l4", "round_robin")]
    assert all(r["attainment"] >= 0.95 > r["attainment_at_fewer"] for r in rows)
    assert (tmp_path / "plan.png").is_file()
