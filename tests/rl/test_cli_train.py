"""`lbbench train` end to end on a small run, and its flag errors."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
from click.testing import CliRunner

import lbbench
from lbbench.cli.train import train
from lbbench.routers.rl.policy import QPolicy


def test_train_command_writes_a_checkpoint(tmp_path):
    out = tmp_path / "ckpt"
    res = CliRunner().invoke(train, [
        "--recipe", "paper", "--router", "baseline_rl", "--profile", "llama2-7b-v100", "--instances", "2",
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
    # the recipe is the first option, and says what it sets
    assert res.output.index("--recipe") < res.output.index("--router")
    assert "--teacher kv_gate" in res.output and "--dagger-rounds 8" in res.output


def test_the_default_recipe_is_the_shipped_one_and_flags_override_it(tmp_path):
    """No recipe flag: the settings of the shipped wgrl checkpoints (their config.json), except
    what the command line gives."""
    shipped = json.loads((Path(lbbench.__file__).parent / "checkpoints" / "wgrl" / "llama2-7b-v100-4x"
                          / "config.json").read_text())
    out = tmp_path / "ckpt"
    given = {"instances": 2, "requests": 30, "rate": 10.0, "episodes": 1, "bc_episodes": 1, "dagger_rounds": 0,
             "imitation_updates": 10, "workers": 1, "learning_starts": 16, "batch_size": 16,
             "buffer_size": 1000, "val_seeds": 1, "validation_gate": False}
    args = [a for k, v in given.items() if not isinstance(v, bool)
            for a in ("--" + k.replace("_", "-"), str(v))] + ["--no-validation-gate"]
    res = CliRunner().invoke(train, [*args, "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    cfg = json.loads((out / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if k in given} == given
    recipe = {k: v for k, v in shipped.items() if k not in given and k in cfg}
    assert {k: cfg[k] for k in recipe} == recipe
    assert cfg["teacher"] == "kv_gate" and cfg["network"] == "shared"
