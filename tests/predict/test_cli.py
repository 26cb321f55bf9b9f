"""`lbbench predictor` CLI: metadata train/eval end to end, bad input -> exit 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from lbbench.cli.predict import predictor


def test_train_and_eval_metadata(tiny_corpus, tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "meta"
    r = CliRunner().invoke(predictor, ["train", "--data", str(tiny_corpus), "--kind", "metadata",
                                       "--out", str(out), "--format", "json", "--test-fraction", "0.3"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["kind"] == "metadata" and rep["n"] > 0
    assert rep["accuracy"] >= rep["majority_baseline_accuracy"]
    assert json.loads((out / "metrics.json").read_text())["n"] == rep["n"]
    r = CliRunner().invoke(predictor, ["eval", "--model", str(out), "--data", str(tiny_corpus), "--format", "json"])
    assert r.exit_code == 0, r.output
    again = json.loads(r.stdout)
    assert again["n"] == rep["n"]  # only the held-out prompts
    # the task sets the length in the tiny corpus: the metadata model ranks it well; p90 is the bucket's upper edge
    assert again["kendall_tau"] > 0.5 and again["p90_coverage"] == 1.0
    assert again["kendall_tau"] == pytest.approx(rep["kendall_tau"])


@pytest.mark.parametrize("args, needle", [
    (["train", "--data", "{missing}", "--kind", "metadata", "--out", "{out}"], "--data"),
    (["train", "--data", "{bad}", "--kind", "metadata", "--out", "{out}"], "bad.jsonl:1"),
    (["train", "--data", "{corpus}", "--kind", "metadata", "--out", "{out}", "--profile", "no_such"], "--profile"),
    (["eval", "--model", "{out}", "--data", "{corpus}"], "--model"),
    (["train", "--data", "{corpus}", "--kind", "nope", "--out", "{out}"], "--kind"),
])
def test_bad_input_exits_2_with_one_line(tiny_corpus, tmp_path, args, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    subst = {"missing": str(tmp_path / "missing.jsonl"), "bad": str(bad), "out": str(tmp_path / "o"),
             "corpus": str(tiny_corpus)}
    r = CliRunner().invoke(predictor, [a.format(**subst) for a in args])
    assert r.exit_code == 2, r.output
    assert needle in r.output
