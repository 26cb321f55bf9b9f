"""Efficiency factors fitted to measured GPU timings: the reader, the fit against a checked-in slice of Vidur's
files (values computed by hand in the comments), the soft roofline's invariants and the shipped table's targets.
The slice (tests/profiling/data/vidur, README there) is 12 rows of three files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from lbbench.cli import main
from lbbench.profiling.efficiency import fit_efficiency, load_table, soft_max, soft_roofline_s
from lbbench.profiling.efficiency_build import build_table
from lbbench.profiling.gpus import get_gpu
from lbbench.profiling.vidur import MeasurementError, read_block_timings

SLICE = Path(__file__).parent / "data" / "vidur"
A100_7B = SLICE / "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv"
# 4096 x 4096 x 3 (QKV) + 4096 x 4096 (output) + 3 x 4096 x 11008 (gate, up, down)
LLAMA2_7B_BLOCK_PARAMS = 202_375_168
# the slice's block times (ms): 8.2255 at 4096 tokens, 2.135 at 1024 -> 6.0905 / 3072 ms per token per block
SLICE_7B_MARGINAL_S = 6.0905e-3 / 3072


def test_reader_sums_a_blocks_ops():
    t = read_block_timings(A100_7B)[1]
    assert t.block_params_per_gpu == LLAMA2_7B_BLOCK_PARAMS
    # 0.005 + 0.065 + 0.005 + 0.025 + 0.005 + 0.116 + 0.007 + 0.06 + 2 x 0.002 ms
    assert t.at(1) == pytest.approx(0.292e-3)
    assert list(t.num_tokens) == [1, 2, 4, 8, 16, 64, 128, 256, 512, 1024, 2048, 4096]


def test_fit_reproduces_the_slices_marginal_cost_and_small_batch_bandwidth():
    fit = fit_efficiency([read_block_timings(A100_7B)[1]], get_gpu("a100-80gb"))
    # 2 x 202,375,168 / (312e12 x 1.98258e-6 s) = 0.6543
    assert fit.prefill_mfu == pytest.approx(0.654, abs=1e-3)
    # 404,750,336 B / 2,039e9 B/s over 0.292, 0.282, 0.284, 0.285 ms: 0.6798, 0.7039, 0.6990, 0.6965 -> 0.6948
    assert fit.weight_bw_util == pytest.approx(0.695, abs=1e-3)
    # the point of SHARPNESS_GRID (1.00 to 8.00 by 0.01) whose soft roofline, at the MFU and bandwidth above, has the
    # least RMS log error over the slice's 12 timings: a fit to this committed slice, pinned so that a change of
    # the fit or of the roofline shows
    assert fit.sharpness == 2.09
    # the fitted prefill MFU reproduces the slice's marginal cost per token: 2 x weights / (MFU x peak)
    assert 2 * LLAMA2_7B_BLOCK_PARAMS / (fit.prefill_mfu * 312e12) == pytest.approx(SLICE_7B_MARGINAL_S, rel=1e-3)


def test_build_table_on_the_slice_fits_a100_and_holds_h100_out():
    doc = build_table(SLICE, "0" * 40)
    assert doc["source"]["commit"] == "0" * 40 and doc["source"]["licence"] == "MIT"
    (row,) = doc["fit"]
    assert row["gpu"] == "a100-80gb" and row["tp"] == 1 and row["models"] == ["Llama-2-7b-hf", "Meta-Llama-3-8B"]
    assert all("/a100/" in f for f in row["files"])
    (held,) = doc["validation"]
    assert held["gpu"] == "h100" and held["fitted_on"] == "a100-80gb" and "/h100/" in held["file"]
    # the held-out errors use the A100 factors unchanged: refitting on H100 would give other factors
    own = fit_efficiency([read_block_timings(SLICE / held["file"])[1]], get_gpu("h100"))
    assert (own.prefill_mfu, own.weight_bw_util) != (row["prefill_mfu"], row["weight_bw_util"])


def test_missing_column_names_file_and_column(tmp_path):
    bad = tmp_path / "mlp.csv"
    bad.write_text(A100_7B.read_text().replace("time_stats.attn_rope.median", "rope"))
    with pytest.raises(MeasurementError, match=r"mlp.csv: missing column 'time_stats.attn_rope.median'"):
        read_block_timings(bad)


@given(st.floats(1e-6, 1.0), st.floats(1e-6, 1.0), st.floats(1.0, 20.0))
def test_soft_max_lies_between_max_and_its_bound(a, b, p):
    s = soft_max(a, b, p)
    assert max(a, b) * (1 - 1e-12) <= s <= 2 ** (1 / p) * max(a, b) * (1 + 1e-12)
    assert soft_max(a, b, math.inf) == max(a, b)


def test_roofline_grows_with_tokens_and_meets_both_limits():
    kw = dict(bytes_per_param=2, peak_flops=312e12, bandwidth_bytes_s=2039e9, prefill_mfu=0.674,
              weight_bw_util=0.694, sharpness=1.34)
    t = soft_roofline_s(LLAMA2_7B_BLOCK_PARAMS, [1, 16, 256, 4096], **kw)
    assert all(x < y for x, y in zip(t, t[1:]))
    # one token: the weight read 404.75 MB / (0.694 x 2039 GB/s) = 0.28603 ms, softly maxed with 2 x 202.4e6 /
    # (0.674 x 312e12) = 1.925 us of compute: 0.28603 x (1 + 0.006730 ** 1.34) ** (1 / 1.34) = 0.28629 ms
    assert t[0] == pytest.approx(0.28629e-3, rel=2e-4)
    # 4096 tokens: within 1 % of the compute limit 2 x 202.4e6 x 4096 / (0.674 x 312e12) = 7.884 ms
    assert t[-1] == pytest.approx(7.884e-3, rel=0.01)


def test_shipped_fit_meets_the_targets():
    """The shipped table's own numbers: A100 fit, H100 held out, and derive against the measured figures."""
    table = load_table()
    assert table.source["commit"] and table.source["licence"] == "MIT"
    tp1 = [r for r in table.rows if r.tp == 1 and "Llama-2-7b-hf" in r.models]
    assert tp1 and "mean |error|" in tp1[0].fit_error
    held = [v for v in table.validation if v["tp"] == 1 and "Llama-2-7b-hf" in v["file"]]
    assert held and held[0]["mean_abs_pct"] <= 15.0
    doc = json.loads(CliRunner().invoke(main, ["profile", "efficiency", "--format", "json"]).output)
    errors = {e["file"].split("/")[-2]: e for r in doc["fit"] if r["tp"] == 1 for e in r["errors"]}
    for hf in ("Llama-2-7b-hf", "Meta-Llama-3-8B"):
        assert errors[hf]["mean_abs_pct"] <= 10.0


def test_cli_efficiency_refit_bad_input_one_line_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["profile", "efficiency", "--vidur", str(tmp_path), "--commit", "abc",
                                    "--out", str(tmp_path / "e.toml")])
    assert res.exit_code == 2
    assert "no a100 mlp.csv" in res.output and len(res.output.strip().splitlines()) == 1
