"""``lbbench predictor``: train and evaluate output-length predictors.

    lbbench predictor train --data CORPUS --kind text|embed|bow|metadata|task --out DIR
    lbbench predictor eval  --model DIR --data CORPUS [--format table|json]

``train`` splits the corpus (stratified by output bucket, grouped by prompt),
fits on the training part, saves the model directory and prints the held-out
evaluation (also saved as ``DIR/metrics.json``). ``eval`` evaluates a saved
directory on any corpus, skipping prompts it was trained on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ..predict.base import SCHEMES, PredictorSpecError, get_scheme
from ..predict.data import DataError, load_corpus, stratified_split, token_counter_name
from ..predict.metadata import train_metadata_model
from ..predict.regression import LengthTrainConfig, train_length_model
from ..predict.text import TextTrainConfig, train_text_model
from ..profiles import load_profile
from .flags import user_message


def _usage(exc: Exception) -> click.UsageError:
    return click.UsageError(user_message(exc))


def _load(data: tuple[str, ...], models: str | None, max_examples: int | None, seed: int,
          token_counts_only: bool = False):
    try:
        return load_corpus(list(data), models=[m for m in models.split(",") if m] if models else None,
                           max_examples=max_examples, seed=seed, token_counts_only=token_counts_only)
    except DataError as exc:
        raise _usage(exc) from None


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4f}"
    return str(x)


def render_table(report: dict[str, Any]) -> str:
    lines = []
    for k, v in report.items():
        if k in ("per_bucket", "confusion", "bucket_labels", "per_model", "chosen"):
            continue
        lines.append(f"{k:<34} {_fmt(v)}")
    labels = report.get("bucket_labels") or []
    if report.get("per_bucket"):
        lines.append("")
        lines.append(f"{'bucket':<8}{'tokens':<14}{'support':>8}{'precision':>11}{'recall':>9}")
        for row in report["per_bucket"]:
            b = row["bucket"]
            lines.append(f"{b:<8}{labels[b] if b < len(labels) else '':<14}{row['support']:>8}"
                         f"{_fmt(row['precision']):>11}{_fmt(row['recall']):>9}")
    if report.get("per_model"):
        lines.append("")
        lines.append(f"{'model':<36}{'n':>6}{'tau':>8}{'accuracy':>10}{'p90 cov':>9}{'mean true':>11}"
                     f"{'mean pred':>11}")
        for m in report["per_model"]:
            lines.append(f"{str(m['model'] or '-'):<36}{m['n']:>6}{_fmt(m['kendall_tau']):>8}"
                         f"{_fmt(m['accuracy']):>10}{_fmt(m['p90_coverage']):>9}{m['mean_true_tokens']:>11.1f}"
                         f"{m['mean_expected_tokens']:>11.1f}")
    if report.get("confusion"):
        lines.append("")
        lines.append("confusion (rows: true bucket, columns: predicted)")
        n = len(report["confusion"])
        lines.append("      " + "".join(f"{j:>7}" for j in range(n)))
        for i, row in enumerate(report["confusion"]):
            lines.append(f"{i:>6}" + "".join(f"{c:>7}" for c in row))
    return "\n".join(lines)


def _emit(report: dict[str, Any], fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(report, indent=1))
    else:
        click.echo(render_table(report))


def _train_encoder_model(kind: str, train, scheme, log, *, encoder: str, max_length: int, use_model_name: bool,
                         max_layers: int | None, validation: str, seed: int, **fine_tune: Any):
    """Train a text model (``embed``/``bow`` regressor or fine-tuned ``text``/``task``); errors as usage errors."""
    try:
        if kind in ("embed", "bow"):
            return train_length_model(train, scheme, LengthTrainConfig(
                features="encoder" if kind == "embed" else "bow", encoder=encoder, max_length=max_length,
                use_model_name=use_model_name, seed=seed, validation=validation,
                **({} if max_layers is None else {"max_layers": max_layers})), log=log)

        return train_text_model(train, scheme, TextTrainConfig(
            encoder=encoder, objective="task" if kind == "task" else "bucket+task", max_length=max_length,
            seed=seed, **fine_tune), log=log)
    except OSError as exc:
        raise click.BadParameter(str(exc).splitlines()[0], param_hint="--encoder") from None
    except ValueError as exc:
        raise _usage(exc) from None


@click.group("predictor")
def predictor() -> None:
    """Train and evaluate output-length predictors."""


@predictor.command("train")
@click.option("--data", "data", multiple=True, required=True, type=click.Path(),
              help="corpus file or directory (repeatable); native JSONL or a known public format")
@click.option("--kind", type=click.Choice(["embed", "text", "bow", "metadata", "task"]), default="embed",
              show_default=True,
              help="embed (default): frozen encoder embedding + model name -> length distribution (ridge / "
              "bucket-logistic head chosen on held-out ranking; held-out MT-Bench: Kendall tau 0.43, 49.4 %% "
              "accuracy); text: fine-tuned encoder -> bucket (+ task head; tau 0.13 there); bow: the embed heads "
              "on hashed bag of words; metadata: prompt length + task; task: task classifier")
@click.option("--no-model-name", is_flag=True, help="embed/bow: do not condition on the generating model's name")
@click.option("--validation", type=click.Choice(["prompt", "task"]), default="prompt", show_default=True,
              help="embed/bow: hold out a share of the prompts, or each task (source subset) in turn, "
              "to choose layer and head")
@click.option("--max-layers", type=click.IntRange(0), default=None,
              help="embed: consider encoder layers up to this one only (0: pooled token embeddings); "
              "inference cost grows with the layer chosen")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="output directory")
@click.option("--encoder", default=None, help="transformers model name or path (default: bundled all-MiniLM-L6-v2)")
@click.option("--scheme", type=click.Choice(SCHEMES), default="paper", show_default=True, help="bucket scheme")
@click.option("--profile", default=None, help="profile whose decode rate / max_model_len set the buckets")
@click.option("--epochs", type=click.IntRange(1, 100), default=2, show_default=True)
@click.option("--max-examples", type=click.IntRange(1), default=None, help="random subset of the corpus")
@click.option("--models", default=None, help="keep rows whose generating model contains one of these "
              "comma-separated substrings")
@click.option("--test-fraction", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), default=0.2,
              show_default=True)
@click.option("--max-length", type=click.IntRange(8, 512), default=128, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True)
@click.option("--lr", type=click.FloatRange(0.0, min_open=True), default=1e-4, show_default=True)
@click.option("--freeze-layers", type=click.IntRange(0), default=0, show_default=True,
              help="freeze the embeddings and this many lower encoder layers")
@click.option("--num-layers", type=click.IntRange(0), default=0, show_default=True,
              help="keep only this many lower encoder layers (0: all); fewer is faster")
@click.option("--estimator", type=click.Choice(["gbdt", "random_forest"]), default="gbdt", show_default=True,
              help="metadata model")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def train_cmd(data, kind, no_model_name, validation, max_layers, out_dir, encoder, scheme, profile, epochs, max_examples, models,
              test_fraction, max_length, batch_size, lr, freeze_layers, num_layers, estimator, seed, fmt) -> None:
    """Train a predictor and print its held-out evaluation."""
    prof = None
    if profile:
        try:
            prof = load_profile(profile)
        except ValueError as exc:
            raise _usage(exc) from None
    bucket_scheme = get_scheme(scheme, prof)
    corpus = _load(data, models, max_examples, seed, token_counts_only=kind == "metadata")
    train, test = stratified_split(corpus.examples, bucket_scheme, test_fraction, seed)
    if not test:
        raise click.UsageError(f"--data: too few prompts ({len(corpus.examples)} rows) for a held-out split")
    log = lambda s: click.echo(s, err=True)  # noqa: E731
    log(f"{len(corpus.examples)} rows from {len(corpus.files_read)} files ({len(train)} train, {len(test)} test); "
        f"tokens counted with {token_counter_name()}; scheme {bucket_scheme.name} {bucket_scheme.labels()}")
    if kind == "metadata":
        model = train_metadata_model(train, bucket_scheme, estimator=estimator, seed=seed)
    else:
        model = _train_encoder_model(kind, train, bucket_scheme, log, encoder=encoder or "", max_length=max_length,
                                     use_model_name=not no_model_name, max_layers=max_layers,
                                     validation=validation, epochs=epochs,
                                     batch_size=batch_size, lr=lr, freeze_layers=freeze_layers,
                                     num_layers=num_layers, seed=seed)
    model.save(out_dir)
    log(f"trained in {model.config.train_seconds:.1f} s; saved to {out_dir}")
    from ..predict.evaluate import evaluate_dir  # lazy: start-up time (the evaluation's metrics)

    report = evaluate_dir(out_dir, test)
    report["data"] = [str(p) for p in data]
    report["token_counter"] = token_counter_name()
    Path(out_dir, "metrics.json").write_text(json.dumps(report, indent=1))
    _emit(report, fmt)


@predictor.command("eval")
@click.option("--model", "model_dir", required=True, type=click.Path(), help="saved predictor directory")
@click.option("--data", "data", multiple=True, required=True, type=click.Path(), help="corpus (repeatable)")
@click.option("--models", default=None, help="keep rows whose generating model contains one of these substrings")
@click.option("--max-examples", type=click.IntRange(1), default=None)
@click.option("--no-quantize", is_flag=True, help="evaluate the fp32 text model only")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "int8"]), default=None,
              help="inference precision (default: int8 for text, fp32 for embed)")
@click.option("--compare-precisions", is_flag=True, help="also report accuracy and tau in the other precisions")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def eval_cmd(model_dir, data, models, max_examples, no_quantize, precision, compare_precisions, seed, fmt) -> None:
    """Evaluate a saved predictor on a corpus (prompts seen in training are skipped)."""
    from ..predict.evaluate import evaluate_dir, model_kind  # lazy: start-up time (the evaluation's metrics)

    try:
        metadata = model_kind(model_dir) == "metadata"
    except PredictorSpecError as exc:
        raise _usage(exc) from None
    corpus = _load(data, models, max_examples, seed, token_counts_only=metadata)
    try:
        report = evaluate_dir(model_dir, corpus.examples, quantize=not no_quantize, precision=precision,
                              compare_precisions=compare_precisions)
    except PredictorSpecError as exc:
        raise _usage(exc) from None
    _emit(report, fmt)


def main() -> None:  # pragma: no cover - convenience entry point
    predictor(prog_name="lbbench predictor")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
