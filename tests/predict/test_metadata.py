"""Metadata predictor (scikit-learn) end to end."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn")

from lbbench.core import Request  # noqa: E402
from lbbench.predict import get_scheme, load_predictor  # noqa: E402
from lbbench.predict.data import load_corpus  # noqa: E402
from lbbench.predict.metadata import MetadataPredictor, train_metadata_model  # noqa: E402


@pytest.mark.parametrize("estimator", ["gbdt", "random_forest"])
def test_metadata_learns_task_lengths_and_roundtrips(tiny_corpus, tmp_path, estimator):
    scheme = get_scheme("paper")
    ex = load_corpus(tiny_corpus).examples
    mp = train_metadata_model(ex, scheme, estimator=estimator)
    reqs = [Request(i, 0.0, e.prompt_tokens, e.output_tokens, e.task) for i, e in enumerate(ex)]
    preds = mp.predict(reqs)
    acc = sum(p.bucket == scheme.bucket_of(r.output_tokens) for p, r in zip(preds, reqs)) / len(reqs)
    assert acc > 0.9  # the task decides the bucket in this corpus
    mp.save(tmp_path / "m")
    loaded = load_predictor(f"metadata:{tmp_path / 'm'}")
    assert isinstance(loaded, MetadataPredictor)
    assert loaded.predict(reqs) == preds
    assert loaded.predict([]) == []


def test_metadata_load_errors(tmp_path):
    from lbbench.predict import PredictorSpecError

    with pytest.raises(PredictorSpecError, match="^predictor metadata:"):
        load_predictor(f"metadata:{tmp_path}")


def _token_trace(path, n=300, seed=0):
    """An Azure-format trace (no text) whose output length follows the prompt length."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(n):
        p = int(rng.integers(10, 2000))
        o = 20 if p < 500 else (120 if p < 1200 else 400)
        lines.append(f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.0000000,{p},{o}")
    path.write_text("\n".join(lines) + "\n")


def test_metadata_trains_on_a_traces_token_counts_and_matches_the_cli(tmp_path):
    """A trace without text is a corpus for the metadata predictor: the library path
    (``train_from_trace``) and the CLI path (``bench/trace_corpus.py`` + ``lbbench
    predictor train --kind metadata``) give the same model, and it learns the lengths."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from click.testing import CliRunner

    from lbbench.cli import main
    from lbbench.predict.data import stratified_split
    from lbbench.predict.metadata import MODEL_FILE, train_from_trace

    trace = tmp_path / "azure.csv"
    _token_trace(trace)
    lib = train_from_trace(trace, tmp_path / "lib", window=(60.0, float("inf")))
    assert lib.config.num_train_examples == round(240 * 0.8)  # the window's rows, less the test share
    corpus = tmp_path / "rows.jsonl"
    script = Path(__file__).resolve().parents[2] / "bench" / "trace_corpus.py"
    subprocess.run([sys.executable, str(script), str(trace), "--window", "60:1e9", "--out", str(corpus)],
                   check=True, capture_output=True)
    rows = [json.loads(x) for x in corpus.read_text().splitlines()]
    assert len(rows) == 240 and rows[0]["prompt"] == "" and rows[0]["task"] == "conversation"
    # without the metadata switch, rows without text are no corpus; with it they are
    with pytest.raises(Exception, match="no usable rows"):
        load_corpus(corpus)
    ex = load_corpus(corpus, token_counts_only=True).examples
    train, test = stratified_split(ex, get_scheme("paper"), 0.2, 0)
    assert len(train) + len(test) == 240 and len(test) > 30  # each text-less row is its own group
    res = CliRunner().invoke(main, ["predictor", "train", "--kind", "metadata", "--data", str(corpus),
                                    "--out", str(tmp_path / "cli"), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "cli" / MODEL_FILE).read_bytes() == (tmp_path / "lib" / MODEL_FILE).read_bytes()
    report = json.loads(res.output[res.output.index("{"):])
    assert report["n"] == len(test) and report["accuracy"] > 0.9  # held-out rows are evaluated, not skipped
    res = CliRunner().invoke(main, ["predictor", "eval", "--model", str(tmp_path / "cli"), "--data", str(corpus),
                                    "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output[res.output.index("{"):])["n"] == 240
