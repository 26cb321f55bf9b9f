"""Evaluate a saved predictor directory on a corpus.

Rows whose prompt was in the model's training set are dropped first (saved
models keep prompt fingerprints), so evaluating on the same corpus the model
was trained on measures the held-out split only.

Reported (fixed metric names, used by ``lbbench predictor eval --format json``):

* buckets: ``n``, ``accuracy`` (task hint given when the row has a task),
  ``accuracy_without_task_hint``, ``accuracy_predicted_task_hint`` (text: the
  task head's guess as hint), ``accuracy_fp32`` / ``accuracy_bf16`` /
  ``accuracy_int8`` (the same model in another precision),
  ``majority_baseline_accuracy`` (the training set's majority bucket),
  ``test_majority_accuracy`` (the evaluated rows' own majority bucket: the
  best constant in hindsight), ``prompt_length_baseline_accuracy``,
  ``task_classifier_accuracy`` (+ ``task_n``), ``per_bucket``, ``confusion``;
* ranking and calibration of the expected length: ``kendall_tau`` (tau-b),
  ``spearman_rho``, ``mae_tokens``, ``p50_coverage`` / ``p90_coverage`` (share
  of rows at or below the predicted p50 / p90),
  ``prompt_length_baseline_kendall_tau`` (tau of the prompt length itself: the
  order a router gets from prompt length alone), ``within_model_kendall_tau``
  (mean over generating models of the tau within each, weighted by rows: what
  the model's name cannot explain), ``per_model`` (n, tau, accuracy, p90
  coverage per generating model); ``kendall_tau_<precision>`` beside
  ``accuracy_<precision>``.

Length regressors (``embed``/``bow``) are conditioned on each row's ``model``.
An undefined metric (tau of constant predictions, say) is ``None``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ..core import Request
from .base import BucketScheme, Prediction, PredictorSpecError
from .data import Example, prompt_fingerprint
from .metadata import MetadataPredictor
from .metrics import LengthBaseline, accuracy, bucket_metrics, coverage, kendall_tau, majority_bucket, mae, spearman_rho
from .regression import LengthPredictor
from .text import TextPredictor


def model_kind(model_dir: str | Path) -> str:
    cfg = Path(model_dir) / "config.json"
    if not cfg.is_file():
        raise PredictorSpecError(f"model: {model_dir}: no config.json (not a saved predictor directory)")
    kind = json.loads(cfg.read_text()).get("kind")
    if kind not in ("text", "metadata", "embed", "bow"):
        raise PredictorSpecError(f"model: {cfg}: unknown model kind {kind!r}")
    return kind


def unseen(examples: Sequence[Example], fingerprints: Sequence[str]) -> list[Example]:
    """Rows whose prompt was not in the training set (a row without text, token
    counts only, cannot be recognised and counts as unseen)."""
    seen = set(fingerprints)
    return [e for e in examples if not e.prompt or prompt_fingerprint(e.prompt) not in seen]


def _common(cfg: Any, scheme: BucketScheme, rows: Sequence[Example], pred: list[int]) -> dict[str, Any]:
    true = [scheme.bucket_of(e.output_tokens) for e in rows]
    baseline = LengthBaseline.from_dict(cfg.length_baseline)
    out: dict[str, Any] = {"n": len(rows)}
    m = bucket_metrics(true, pred, scheme.num_buckets)
    out["accuracy"] = m["accuracy"]
    out["majority_baseline_accuracy"] = accuracy(true, [cfg.majority_bucket] * len(rows))
    out["test_majority_accuracy"] = accuracy(true, [majority_bucket(true)] * len(rows))
    out["prompt_length_baseline_accuracy"] = accuracy(true, baseline.predict([e.prompt_tokens for e in rows]))
    out["per_bucket"] = m["per_bucket"]
    out["confusion"] = m["confusion"]
    return out


def ranking_metrics(rows: Sequence[Example], preds: Sequence[Prediction], scheme: BucketScheme) -> dict[str, Any]:
    """Ranking, error and calibration of ``preds`` against the rows' true lengths."""
    true = [e.output_tokens for e in rows]
    exp = [p.expected_tokens for p in preds]
    out: dict[str, Any] = {
        "kendall_tau": kendall_tau(exp, true), "spearman_rho": spearman_rho(exp, true), "mae_tokens": mae(true, exp),
        "p50_coverage": coverage(true, [p.p50 for p in preds]), "p90_coverage": coverage(true, [p.p90 for p in preds]),
        "prompt_length_baseline_kendall_tau": kendall_tau([e.prompt_tokens for e in rows], true)}
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(rows):
        groups.setdefault(e.model or "", []).append(i)
    per_model = []
    for model, idx in sorted(groups.items()):
        t = [true[i] for i in idx]
        per_model.append({"model": model or None, "n": len(idx), "kendall_tau": kendall_tau([exp[i] for i in idx], t),
                          "accuracy": accuracy([scheme.bucket_of(x) for x in t], [preds[i].bucket for i in idx]),
                          "p90_coverage": coverage(t, [preds[i].p90 for i in idx]),
                          "mean_true_tokens": sum(t) / len(t),
                          "mean_expected_tokens": sum(exp[i] for i in idx) / len(idx)})
    scored = [(m["kendall_tau"], m["n"]) for m in per_model if m["kendall_tau"] == m["kendall_tau"]]
    out["within_model_kendall_tau"] = (sum(t * n for t, n in scored) / sum(n for _, n in scored)
                                       if scored else float("nan"))
    out["per_model"] = per_model
    return out


def _requests(rows: Sequence[Example]) -> list[Request]:
    return [Request(i, 0.0, e.prompt_tokens, e.output_tokens, e.task, e.prompt) for i, e in enumerate(rows)]


def _evaluate_regressor(model_dir: str | Path, kind: str, examples: Sequence[Example], precision: str,
                        compare_precisions: bool) -> dict[str, Any]:
    lp = LengthPredictor.load(model_dir, precision=precision)
    rows = unseen(examples, lp.config.train_fingerprints)
    _require(rows, model_dir, len(examples))
    args = ([e.prompt for e in rows], [e.prompt_tokens for e in rows], [e.model for e in rows])
    preds = lp.predict_rows(*args)
    out = _header(kind, lp.scheme, len(examples), rows)
    out["precision"] = precision
    out.update(_common(lp.config, lp.scheme, rows, [p.bucket for p in preds]))
    out.update(ranking_metrics(rows, preds, lp.scheme))
    if compare_precisions and kind == "embed":
        true = [lp.scheme.bucket_of(e.output_tokens) for e in rows]
        for other in ("fp32", "bf16", "int8"):
            if other == precision:
                continue
            op = LengthPredictor.load(model_dir, precision=other).predict_rows(*args)
            out[f"accuracy_{other}"] = accuracy(true, [p.bucket for p in op])
            out[f"kendall_tau_{other}"] = kendall_tau([p.expected_tokens for p in op],
                                                      [e.output_tokens for e in rows])
    c = lp.config
    out["chosen"] = {"features": c.features, "layer": c.layer, "head": c.head, "head_param": c.head_param,
                     "bucket_rule": c.bucket_rule, "use_model_name": c.use_model_name}
    out["train_seconds"] = c.train_seconds
    return _ordered(out)


def evaluate_dir(model_dir: str | Path, examples: Sequence[Example], quantize: bool = True,
                 precision: str | None = None, compare_precisions: bool = False) -> dict[str, Any]:
    """``precision``: for length regressors (default fp32) and text models
    (default int8 unless ``quantize=False``)."""
    kind = model_kind(model_dir)
    if kind in ("embed", "bow"):
        return _evaluate_regressor(model_dir, kind, examples, precision or "fp32", compare_precisions)
    if kind == "metadata":
        mp = MetadataPredictor.load(model_dir)
        rows = unseen(examples, mp.config.train_fingerprints)
        _require(rows, model_dir, len(examples))
        pt, tasks = [e.prompt_tokens for e in rows], [e.task for e in rows]
        pred = mp.predict_buckets(pt, tasks)
        out = _header(kind, mp.scheme, len(examples), rows)
        out.update(_common(mp.config, mp.scheme, rows, pred))
        true = [mp.scheme.bucket_of(e.output_tokens) for e in rows]
        out["accuracy_without_task_hint"] = accuracy(true, mp.predict_buckets(pt, [None] * len(rows)))
        out.update(ranking_metrics(rows, mp.predict(_requests(rows)), mp.scheme))
        out["train_seconds"] = mp.config.train_seconds
        return _ordered(out)


    precision = precision or ("int8" if quantize else "fp32")
    tp = TextPredictor.load(model_dir, precision=precision)
    cfg = tp.config
    rows = unseen(examples, cfg.train_fingerprints)
    _require(rows, model_dir, len(examples))
    prompts, tasks = [e.prompt for e in rows], [e.task for e in rows]
    true = [tp.scheme.bucket_of(e.output_tokens) for e in rows]
    out = _header(kind, tp.scheme, len(examples), rows)
    out["quantized"] = precision != "fp32"
    out["precision"] = precision
    with_task = [i for i, t in enumerate(tasks) if t]
    if cfg.train.get("objective") == "task":
        out["n"] = len(rows)
    else:
        out.update(_common(cfg, tp.scheme, rows, tp.predict_buckets(prompts, tasks, hint="given")))
        out["accuracy_without_task_hint"] = accuracy(true, tp.predict_buckets(prompts, tasks, hint="none"))
        out["accuracy_predicted_task_hint"] = accuracy(
            true, tp.predict_buckets(prompts, [None] * len(rows), hint="auto"))
        out.update(ranking_metrics(rows, tp.predict(_requests(rows)), tp.scheme))
        if precision == "int8" or compare_precisions:
            for other in ("fp32", "bf16", "int8"):
                if other != precision:
                    op = TextPredictor.load(model_dir, precision=other)
                    out[f"accuracy_{other}"] = accuracy(true, op.predict_buckets(prompts, tasks, hint="given"))
    if tp.tasks and with_task:
        guessed = tp.predict_tasks([prompts[i] for i in with_task])
        out["task_classifier_accuracy"] = accuracy([tasks[i] for i in with_task], guessed)
        out["task_n"] = len(with_task)
        out["num_tasks"] = len(tp.tasks)
    out["train_seconds"] = cfg.train_seconds
    return _ordered(out)


def _require(rows: Sequence[Example], model_dir: str | Path, total: int) -> None:
    if not rows:
        raise PredictorSpecError(f"data: all {total} rows were in the training set of {model_dir}; "
                                 "nothing held out to evaluate")


def _header(kind: str, scheme: BucketScheme, total: int, rows: Sequence[Example]) -> dict[str, Any]:
    return {"kind": kind, "scheme": scheme.name, "bucket_labels": scheme.labels(),
            "num_rows_seen_in_training": total - len(rows)}


_ORDER = ("kind", "scheme", "n", "accuracy", "kendall_tau", "spearman_rho", "mae_tokens", "p50_coverage",
          "p90_coverage", "within_model_kendall_tau", "majority_baseline_accuracy", "test_majority_accuracy",
          "prompt_length_baseline_accuracy", "prompt_length_baseline_kendall_tau", "accuracy_without_task_hint",
          "accuracy_predicted_task_hint", "accuracy_fp32", "accuracy_bf16", "accuracy_int8", "kendall_tau_fp32",
          "kendall_tau_bf16", "kendall_tau_int8", "precision", "quantized", "task_classifier_accuracy", "task_n",
          "num_tasks", "num_rows_seen_in_training", "train_seconds")


def _nan_to_none(x: Any) -> Any:
    """Undefined metrics (e.g. tau of constant predictions) become ``None`` (JSON ``null``)."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x


def _ordered(d: dict[str, Any]) -> dict[str, Any]:
    out = {k: d[k] for k in _ORDER if k in d}
    out.update({k: v for k, v in d.items() if k not in out})
    return _nan_to_none(out)
