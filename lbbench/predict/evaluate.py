"""Evaluate a saved predictor directory on a corpus.

Rows whose prompt was in the model's training set are dropped first (saved
models keep prompt fingerprints), so evaluating on the same corpus the model
was trained on measures the held-out split only.

Reported (fixed metric names, used by ``lbbench predictor eval --format json``):
``n``, ``accuracy`` (task hint given when the row has a task),
``accuracy_without_task_hint``, ``accuracy_predicted_task_hint`` (text: the
task head's guess as hint), ``accuracy_fp32`` / ``accuracy_bf16`` (text:
the same model unquantized / in bfloat16),
``majority_baseline_accuracy``, ``prompt_length_baseline_accuracy``,
``task_classifier_accuracy`` (+ ``task_n``), ``per_bucket``, ``confusion``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from .base import BucketScheme, PredictorSpecError
from .data import Example, prompt_fingerprint
from .metrics import LengthBaseline, accuracy, bucket_metrics


def model_kind(model_dir: str | Path) -> str:
    cfg = Path(model_dir) / "config.json"
    if not cfg.is_file():
        raise PredictorSpecError(f"--model: {model_dir}: no config.json (not a saved predictor directory)")
    kind = json.loads(cfg.read_text()).get("kind")
    if kind not in ("text", "metadata"):
        raise PredictorSpecError(f"--model: {cfg}: unknown model kind {kind!r}")
    return kind


def unseen(examples: Sequence[Example], fingerprints: Sequence[str]) -> list[Example]:
    seen = set(fingerprints)
    return [e for e in examples if prompt_fingerprint(e.prompt) not in seen]


def _common(cfg: Any, scheme: BucketScheme, rows: Sequence[Example], pred: list[int]) -> dict[str, Any]:
    true = [scheme.bucket_of(e.output_tokens) for e in rows]
    baseline = LengthBaseline.from_dict(cfg.length_baseline)
    out: dict[str, Any] = {"n": len(rows)}
    m = bucket_metrics(true, pred, scheme.num_buckets)
    out["accuracy"] = m["accuracy"]
    out["majority_baseline_accuracy"] = accuracy(true, [cfg.majority_bucket] * len(rows))
    out["prompt_length_baseline_accuracy"] = accuracy(true, baseline.predict([e.prompt_tokens for e in rows]))
    out["per_bucket"] = m["per_bucket"]
    out["confusion"] = m["confusion"]
    return out


def evaluate_dir(model_dir: str | Path, examples: Sequence[Example], quantize: bool = True) -> dict[str, Any]:
    kind = model_kind(model_dir)
    if kind == "metadata":
        from .metadata import MetadataPredictor

        mp = MetadataPredictor.load(model_dir)
        rows = unseen(examples, mp.config.train_fingerprints)
        _require(rows, model_dir, len(examples))
        pt, tasks = [e.prompt_tokens for e in rows], [e.task for e in rows]
        pred = mp.predict_buckets(pt, tasks)
        out = _header(kind, mp.scheme, len(examples), rows)
        out.update(_common(mp.config, mp.scheme, rows, pred))
        true = [mp.scheme.bucket_of(e.output_tokens) for e in rows]
        out["accuracy_without_task_hint"] = accuracy(true, mp.predict_buckets(pt, [None] * len(rows)))
        out["train_seconds"] = mp.config.train_seconds
        return _ordered(out)

    from .text import TextPredictor

    tp = TextPredictor.load(model_dir, quantize=quantize)
    cfg = tp.config
    rows = unseen(examples, cfg.train_fingerprints)
    _require(rows, model_dir, len(examples))
    prompts, tasks = [e.prompt for e in rows], [e.task for e in rows]
    true = [tp.scheme.bucket_of(e.output_tokens) for e in rows]
    out = _header(kind, tp.scheme, len(examples), rows)
    out["quantized"] = quantize
    with_task = [i for i, t in enumerate(tasks) if t]
    if cfg.train.get("objective") == "task":
        out["n"] = len(rows)
    else:
        out.update(_common(cfg, tp.scheme, rows, tp.predict_buckets(prompts, tasks, hint="given")))
        out["accuracy_without_task_hint"] = accuracy(true, tp.predict_buckets(prompts, tasks, hint="none"))
        out["accuracy_predicted_task_hint"] = accuracy(
            true, tp.predict_buckets(prompts, [None] * len(rows), hint="auto"))
        if quantize:
            for precision in ("fp32", "bf16"):
                other = TextPredictor.load(model_dir, precision=precision)
                out[f"accuracy_{precision}"] = accuracy(true, other.predict_buckets(prompts, tasks, hint="given"))
    if tp.tasks and with_task:
        guessed = tp.predict_tasks([prompts[i] for i in with_task])
        out["task_classifier_accuracy"] = accuracy([tasks[i] for i in with_task], guessed)
        out["task_n"] = len(with_task)
        out["num_tasks"] = len(tp.tasks)
    out["train_seconds"] = cfg.train_seconds
    return _ordered(out)


def _require(rows: Sequence[Example], model_dir: str | Path, total: int) -> None:
    if not rows:
        raise PredictorSpecError(f"--data: all {total} rows were in the training set of {model_dir}; "
                                 "nothing held out to evaluate")


def _header(kind: str, scheme: BucketScheme, total: int, rows: Sequence[Example]) -> dict[str, Any]:
    return {"kind": kind, "scheme": scheme.name, "bucket_labels": scheme.labels(),
            "num_rows_seen_in_training": total - len(rows)}


_ORDER = ("kind", "scheme", "n", "accuracy", "accuracy_without_task_hint", "accuracy_predicted_task_hint",
          "accuracy_fp32", "accuracy_bf16", "quantized", "majority_baseline_accuracy", "prompt_length_baseline_accuracy",
          "task_classifier_accuracy", "task_n", "num_tasks", "num_rows_seen_in_training", "train_seconds")


def _ordered(d: dict[str, Any]) -> dict[str, Any]:
    out = {k: d[k] for k in _ORDER if k in d}
    out.update({k: v for k, v in d.items() if k not in out})
    return out
