"""`lbbench train` end to end on a small run, and its flag errors."""

from __future__ import annotations

import json

import polars as pl
from click.testing import CliRunner

from lbbench.cli.train import train
from lbbench.routers.rl.policy import QPolicy


def test_train_command_writes_a_checkpoint(tmp_path):
    out = tmp_path / "ckpt"
    res = CliRunner().invoke(train, [
        "--router", "baseline_rl", "--profile", "llama2-7b-v100", "--instances", "2",
        "--requests", "30", "--rate", "10", "--episodes", "2", "--explore-episodes", "1",
        "--learning-starts", "16", "--batch-size", "16", "--buffer-size", "1000", "--val-seeds", "1",
        "--max-defer-s", "1", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "trained baseline_rl for llama2-7b-v100 x2 on paper-mix: 2 episodes" in res.output
    pol = QPolicy.load(out)
    assert pol.meta["variant"] == "baseline_rl" and pol.meta["profile"] == "llama2-7b-v100"
    assert pl.read_parquet(out / "curve.parquet").height == 2
    assert json.loads((out / "config.json").read_text())["episodes"] == 2
    assert (out / "last" / "policy.npz").is_file()


def test_train_flag_errors_exit_2(tmp_path):
    runner = CliRunner()
    for args, needle in ((["--rate", "0"], "--rate"), (["--gamma", "1.5"], "--gamma"),
                         (["--workload", "nope"], "--workload"), (["--trace", "missing.csv"], "--trace"),
                         (["--router", "jsq"], "--router"),
                         (["--profile", "no-such-profile"], "--profile")):
        res = runner.invoke(train, [*args, "--out", str(tmp_path / "x"), "--quiet"])
        assert res.exit_code == 2, (args, res.output)
        assert needle in res.output


def test_help_comes_from_field_docstrings():
    res = CliRunner().invoke(train, ["--help"])
    assert "Decisions between target-network syncs." in res.output
    assert "--out" in res.output
