"""``lbbench measured check`` and ``import`` end to end: every bad input is one line naming file, row and column,
with exit 2; good files import and check."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.measured import COLUMN_NAMES, read_measured

FIXTURES = Path(__file__).parent / "fixtures"
HEADER = ",".join(COLUMN_NAMES)


def _row(**cells):
    base = {"id": "a", "stage": "0", "model": "meta-llama/Llama-2-7b-hf", "gpu": "h100", "tp": "1",
            "arrival": "constant", "rate_rps": "5", "output_tokens": "247", "ignore_eos": "true",
            "ttft_mean_ms": "25.0", "e2e_mean_ms": "2000.0", "itl_mean_ms": "7.3"}
    base.update(cells)
    return ",".join(base.get(c, "") for c in COLUMN_NAMES)


def _check(tmp_path, text, *extra):
    p = tmp_path / "m.csv"
    p.write_text(text)
    return p, CliRunner().invoke(main, ["measured", "check", str(p), *extra])


@pytest.mark.parametrize("body, message", [
    (HEADER + "\n" + _row() + "\n\"b,0\n", "line 3: malformed CSV (unexpected end of data)"),
    (HEADER.replace(",gpu,", ",") + "\n", "header: missing required column 'gpu'"),
    (HEADER.replace("ttft_mean_ms", "ttft_mean") + "\n", "header: unknown column 'ttft_mean' (did you mean "
                                                         "'ttft_mean_ms'?)"),
    (HEADER + ",notes,notes\n", "header: column 'notes' appears twice"),
    ("", "empty file (no header row)"),
    (HEADER + "\n", "no data rows"),
    (HEADER + "\n" + _row() + "\n" + _row(id="b", tp="two") + "\n",
     "row 2 (id=b, stage=0), column tp: 'two' is not an integer"),
    (HEADER + "\n" + _row(rate_rps="5 rps") + "\n", "row 1 (id=a, stage=0), column rate_rps: '5 rps' is not a number"),
    (HEADER + "\n" + _row(arrival="gamma") + "\n",
     "row 1 (id=a, stage=0), column arrival: unknown arrival kind 'gamma' (known: poisson, constant, burst)"),
    (HEADER + "\n" + _row(model="") + "\n", "row 1 (id=a, stage=0), column model: empty, but required"),
    (HEADER + "\n" + _row() + ",extra\n", "row 1 (id=a, stage=0): 46 cells, but the header has 45 columns"),
    (HEADER + "\n" + _row() + "\n" + _row() + "\n",
     "row 2 (id=a, stage=0), column stage: duplicate of row 1 (the same id and stage)"),
    (HEADER + "\n" + _row(ttft_p50_ms="30", ttft_p99_ms="20") + "\n",
     "row 1 (id=a, stage=0), column ttft_p99_ms: 20.0 is below ttft_p50_ms 30.0: percentiles must not decrease"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, body, message):
    p, res = _check(tmp_path, body)
    assert res.exit_code == 2, res.output
    assert res.stderr == f"Error: {p}: {message}\n"


def test_missing_file(tmp_path):
    res = CliRunner().invoke(main, ["measured", "check", str(tmp_path / "nope.csv")])
    assert res.exit_code == 2 and res.stderr == f"Error: {tmp_path / 'nope.csv'}: no such file\n"


def test_keep_going_lists_every_bad_row(tmp_path):
    body = HEADER + "\n" + _row(tp="two") + "\n" + _row(id="b") + "\n" + _row(id="c", arrival="gamma") + "\n"
    p, res = _check(tmp_path, body, "--keep-going")
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [
        f"Error: {p}: row 1 (id=a, stage=0), column tp: 'two' is not an integer",
        f"Error: {p}: row 3 (id=c, stage=0), column arrival: unknown arrival kind 'gamma' (known: poisson, constant, "
        "burst)"]


def test_check_prints_flags_and_keeps_extra_columns(tmp_path):
    body = HEADER + ",notes\n" + _row(itl_mean_ms="3.6") + ",hand-made\n"
    p, res = _check(tmp_path, body)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith(f"flag: {p}: row 1 (id=a, stage=0): itl_mean_ms 3.6 is below 3.94 ms, one read of "
                               "the 13.2 GB of fp16 weights")
    assert lines[-1] == f"{p}: 1 rows valid; 1 flags on 1 rows; 0 rows not checked against the model's bounds"
    assert read_measured(p).rows[0].extra == (("notes", "hand-made"),)


def test_import_then_check(tmp_path):
    out = tmp_path / "v.csv"
    res = CliRunner().invoke(main, ["measured", "import", "auto", str(FIXTURES / "vllm_bench_llama8b_h100.json"),
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output == f"wrote 2 rows to {out} (vllm-bench)\n"
    res = CliRunner().invoke(main, ["measured", "check", str(out)])
    assert res.exit_code == 0 and res.output.endswith("2 rows valid; 0 flags on 0 rows; 0 rows not checked "
                                                      "against the model's bounds\n"), res.output


def test_import_bad_context_and_unknown_shape(tmp_path):
    fx = str(FIXTURES / "vllm_bench_llama8b_h100.json")
    res = CliRunner().invoke(main, ["measured", "import", "auto", fx, "--out", str(tmp_path / "o.csv"),
                                    "--set", "tp=two"])
    assert res.exit_code == 2 and res.stderr == "Error: --set tp: 'two' is not an integer\n"
    res = CliRunner().invoke(main, ["measured", "import", "auto", fx, "--out", str(tmp_path / "o.csv"),
                                    "--set", "gpus=h100"])
    assert res.exit_code == 2 and res.stderr == "Error: --set gpus: not a column of the measured-runs schema\n"
    odd = tmp_path / "odd.json"
    odd.write_text('{"hello": 1}')
    res = CliRunner().invoke(main, ["measured", "import", "auto", str(odd), "--out", str(tmp_path / "o.csv")])
    assert res.exit_code == 2 and res.stderr.startswith(f"Error: {odd}: cannot tell which tool wrote this; give the "
                                                        "kind (inference-perf, ")


def test_import_reports_stages_it_cannot_express(tmp_path):
    """GuideLLM's synchronous benchmark is a closed loop: reported, the two open-loop ones written; --strict fails."""
    fx, out = str(FIXTURES / "guidellm_benchmarks.json"), tmp_path / "g.csv"
    res = CliRunner().invoke(main, ["measured", "import", "guidellm", fx, "--out", str(out), "--set", "gpu=h100",
                                    "--set", "tp=1"])
    assert res.exit_code == 0, res.output
    problem = (f"{fx}: (id=guidellm_benchmarks, stage=0), column arrival: strategy 'synchronous' is a closed loop "
               "(a request waits for a free slot): no arrival kind of the schema")
    assert res.stderr.splitlines() == [f"not imported: {problem}"]
    assert [r.stage for r in read_measured(out).rows] == [1, 2]
    res = CliRunner().invoke(main, ["measured", "import", "guidellm", fx, "--out", str(out), "--set", "gpu=h100",
                                    "--set", "tp=1", "--strict"])
    assert res.exit_code == 2 and res.stderr == f"Error: {problem}\n"


def test_import_without_a_required_value_says_which_set_to_give(tmp_path):
    fx = FIXTURES / "aiperf_qwen7b_rate6" / "profile_export_aiperf.json"
    res = CliRunner().invoke(main, ["measured", "import", "aiperf", str(fx), "--out", str(tmp_path / "a.csv")])
    assert res.exit_code == 2
    assert res.stderr == (f"Error: {fx}: (id=aiperf_qwen7b_rate6, stage=0), column gpu: empty, but required; the "
                          "files do not say it: give --set gpu=VALUE\n")
