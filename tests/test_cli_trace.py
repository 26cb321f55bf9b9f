"""``lbbench trace inspect`` / ``convert`` through click's test runner."""

from __future__ import annotations

import json

import click
import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.cli.trace import load_trace_from_options, split_trace_options, trace_transform_options
from lbbench.workloads.errors import WorkloadError

BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n"
            "45,ChatGPT,1087,0,1087,Conversation log\n"
            "118,GPT-4,417,276,693,API log\n"
            "130,GPT-4,5000,20,5020,API log\n")


@pytest.fixture
def burst(tmp_path):
    p = tmp_path / "burst.csv"
    p.write_text(BURSTGPT)
    return p


def test_inspect_json(burst):
    res = CliRunner().invoke(main, ["trace", "inspect", str(burst), "--format", "json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    assert s["format"] == "burstgpt"
    assert s["rows"] == 4 and s["failed_rows"] == 1
    assert s["span_s"] == 125.0
    assert s["rate_per_s"] == pytest.approx(3 / 125)
    assert s["output_tokens_max"] == 276 and s["prompt_tokens_max"] == 5000
    assert s["tasks"] == {"ChatGPT": 2, "GPT-4": 2}
    for key in ("prompt_tokens_mean", "output_tokens_mean", "prompt_tokens_p99", "output_tokens_p99"):
        assert key in s


def test_inspect_with_transforms(burst):
    res = CliRunner().invoke(main, ["trace", "inspect", str(burst), "--format", "json", "--max-prompt-tokens", "2000",
                                     "--window", "10:", "--mapping", "task=Log Type"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    assert s["rows"] == 2  # the 45 s row is failed but kept by inspect; 5 s is outside, 5000 tokens filtered
    assert s["tasks"] == {"Conversation log": 1, "API log": 1}


def test_inspect_table(burst):
    res = CliRunner().invoke(main, ["trace", "inspect", str(burst)])
    assert res.exit_code == 0, res.output
    assert "burstgpt" in res.output and "prompt" in res.output and "p99" in res.output


def test_convert_round_trip(burst, tmp_path):
    out = tmp_path / "out.parquet"
    res = CliRunner().invoke(main, ["trace", "convert", str(burst), str(out), "--rate", "2", "--requests", "2"])
    assert res.exit_code == 0, res.output
    assert "wrote 2 requests" in res.output
    df = pl.read_parquet(out)
    assert df.get_column("prompt_tokens").to_list() == [472, 417]
    assert df.get_column("arrival_s").to_list() == [0.0, 0.5]
    res = CliRunner().invoke(main, ["trace", "inspect", str(out), "--format", "json"])
    assert json.loads(res.output)["format"] == "canonical"


def test_bad_row_is_one_line_exit_2(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text(BURSTGPT.replace("118,GPT-4,417", "118,GPT-4,lots"))
    res = CliRunner().invoke(main, ["trace", "inspect", str(p)])
    assert res.exit_code == 2
    assert res.output.strip() == f"Error: {p}: row 3: Request tokens is not a number ('lots')"
    res = CliRunner().invoke(main, ["trace", "inspect", str(p), "--skip-bad-rows", "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.output)["skipped_rows"] == 1


@pytest.mark.parametrize("args, needle", [
    (["--window", "9:3"], "--window"),
    (["--mapping", "arrival"], "--mapping"),
    (["--trace-format", "nope"], "--trace-format"),
    (["--max-prompt-tokens", "0"], "--max-prompt-tokens"),
    (["--time-scale", "2", "--rate", "3"], "--time-scale: both it and the rate"),
])
def test_bad_flags_exit_2(burst, args, needle):
    res = CliRunner().invoke(main, ["trace", "inspect", str(burst), *args])
    assert res.exit_code == 2
    assert needle in res.output


def test_unknown_format_suggests_mapping(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b,c\n1,2,3\n")
    res = CliRunner().invoke(main, ["trace", "inspect", str(p)])
    assert res.exit_code == 2 and "give a mapping arrival=COL" in res.output
    res = CliRunner().invoke(main, ["trace", "inspect", str(p), "--mapping", "arrival=a,prompt=b,output=c",
                                     "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.output)["format"] == "mapped"


def test_shared_options_reusable_by_run(burst):
    """A command like ``lbbench run`` adds the flags and loads requests with its own --rate/--requests."""
    seen = {}

    @click.command()
    @click.option("--trace", "trace_path")
    @click.option("--rate", type=float)
    @click.option("--requests", type=int)
    @trace_transform_options
    def run(trace_path, rate, requests, **kwargs):
        seen["requests"] = load_trace_from_options(trace_path, kwargs, rate=rate, requests=requests)

    res = CliRunner().invoke(run, ["--trace", str(burst), "--rate", "1", "--max-prompt-tokens", "1000"])
    assert res.exit_code == 0, res.output
    reqs = seen["requests"]
    assert [r.prompt_tokens for r in reqs] == [472, 417]
    assert [r.arrival_s for r in reqs] == [0.0, 1.0]
    assert [r.task for r in reqs] == ["ChatGPT", "GPT-4"]
    res = CliRunner().invoke(run, ["--trace", str(burst), "--window", "500:"])
    # a user error for the command group to print in one line (lbbench run's own path: test_cli_run.py)
    assert isinstance(res.exception, WorkloadError) and "no requests left" in str(res.exception)
    read, transform = split_trace_options({"trace_format": None, "mapping": None, "skip_bad_rows": False,
                                           "time_scale": None, "window": None, "max_prompt_tokens": 5,
                                           "prompt_overflow": "truncate", "other": 1})
    assert read == {"fmt": None, "mapping": None, "skip_bad_rows": False}
    assert transform["max_prompt_tokens"] == 5 and "other" not in transform
