"""``lbbench fidelity --measured`` end to end through the CLI, and its bad input."""

from __future__ import annotations

import polars as pl
from click.testing import CliRunner

from conftest import COLUMNS, shared_prefix_row, write_rows
from lbbench.cli import main


def test_measured_table_through_the_cli(small_table, tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["fidelity", "--measured", str(small_table), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "MAPE by metric" in res.output and "experiments: 1, stages simulated: 2, not covered: 0" in res.output
    frame = pl.read_parquet(out / "fidelity.parquet")
    # every metric each row has: mean E2E, mean TTFT, ITL, throughput, output tokens/s, for both stages
    assert frame.filter(pl.col("metric") == "e2e_mean_ms").height == 2
    assert set(frame["metric"].drop_nulls()) >= {"e2e_mean_ms", "ttft_mean_ms", "itl_mean_ms", "throughput_rps"}
    assert (out / "fidelity.txt").read_text().startswith("Simulator against")
    assert "<html" in (out / "fidelity.html").read_text()


def test_a_row_that_cannot_run_is_listed_and_the_rest_run(tmp_path):
    path = write_rows(tmp_path / "m.csv", [shared_prefix_row(),
                                           shared_prefix_row(id="exp-b", model="acme/unknown-13b")])
    res = CliRunner().invoke(main, ["fidelity", "--measured", str(path)])
    assert res.exit_code == 0, res.output
    assert "not covered: 1" in res.output and "exp-b" in res.output and "no shipped config" in res.output


def test_missing_file_is_one_line_and_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["fidelity", "--measured", str(tmp_path / "nope.csv")])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "nope.csv: no such file" in res.output


def test_missing_required_column_names_it(tmp_path):
    p = tmp_path / "m.csv"
    cols = [c for c in COLUMNS if c != "rate_rps"]
    row = shared_prefix_row()
    p.write_text(",".join(cols) + "\n" + ",".join(row[c] for c in cols) + "\n")
    res = CliRunner().invoke(main, ["fidelity", "--measured", str(p)])
    assert res.exit_code == 2 and "missing required column 'rate_rps'" in res.output


def test_bad_calibration_file_names_the_key(small_table, tmp_path):
    cal = tmp_path / "cal.toml"
    cal.write_text("[efficiency]\nweight_bw_util = 1.7\n")
    res = CliRunner().invoke(main, ["fidelity", "--measured", str(small_table), "--calibration", str(cal)])
    assert res.exit_code == 2 and "weight_bw_util 1.7 is outside (0, 1]" in res.output


def test_mape_gate_fails_the_run(small_table):
    res = CliRunner().invoke(main, ["fidelity", "--measured", str(small_table), "--max-mape", "e2e_mean_ms=0.001"])
    assert res.exit_code == 1 and "e2e_mean_ms MAPE" in res.output


def test_a_bad_row_is_reported_the_good_ones_run_and_the_exit_is_2(tmp_path):
    path = write_rows(tmp_path / "m.csv", [shared_prefix_row(), shared_prefix_row(id="exp-b", tp="two")])
    res = CliRunner().invoke(main, ["fidelity", "--measured", str(path)])
    assert res.exit_code == 2
    assert "experiments: 1, stages simulated: 1" in res.stdout
    assert "row 2 (id=exp-b, stage=0), column tp" in res.stderr
