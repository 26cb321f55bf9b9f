"""Metadata predictor: output bucket from prompt token count + task/application
name, for traces without prompt text (the paper's random forest on the
production trace).

Features: ``prompt_tokens`` and a one-hot encoding of the task over the tasks
seen in training (an unseen or missing task is all zeros). Model: scikit-learn
``GradientBoostingClassifier`` (default; single-threaded, shallow trees) or ``RandomForestClassifier``.
Saved as a directory: ``config.json`` + ``model.pkl`` (pickle of the
scikit-learn estimator; load only directories you trust).
"""

from __future__ import annotations

import json
import pickle
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core import Request
from ..workloads.trace_transform import transform_trace
from ..workloads.traces import read_trace
from .base import BucketScheme, Prediction, PredictorSpecError, TrainedModelConfig, get_scheme
from .data import Example, prompt_fingerprint, stratified_split
from .metrics import LengthBaseline, bucket_expected_tokens, majority_bucket

CONFIG_FILE = "config.json"
MODEL_FILE = "model.pkl"


@dataclass(kw_only=True)
class MetadataModelConfig(TrainedModelConfig):
    estimator: str
    seed: int = 0
    kind: str = "metadata"


def _features(prompt_tokens: Sequence[int], tasks: Sequence[str | None], vocab: dict[str, int]):
    x = np.zeros((len(prompt_tokens), 1 + len(vocab)), dtype=np.float64)
    x[:, 0] = prompt_tokens
    for i, t in enumerate(tasks):
        j = vocab.get(t or "")
        if j is not None:
            x[i, 1 + j] = 1.0
    return x


class MetadataPredictor:
    """Follows the ``Predictor`` protocol; uses ``prompt_tokens`` and ``task`` only."""

    def __init__(self, config: MetadataModelConfig, model: Any):
        self.config = config
        self.model = model
        self.scheme = BucketScheme.from_dict(config.scheme)
        self.vocab = {t: i for i, t in enumerate(config.tasks)}
        self.name = "metadata"

    def predict_buckets(self, prompt_tokens: Sequence[int], tasks: Sequence[str | None]) -> list[int]:
        if not prompt_tokens:
            return []
        return [int(b) for b in self.model.predict(_features(prompt_tokens, tasks, self.vocab))]

    def predict(self, requests: Sequence[Request]) -> list[Prediction]:
        buckets = self.predict_buckets([r.prompt_tokens for r in requests], [r.task for r in requests])
        exp = self.config.bucket_expected_tokens
        return [Prediction(b, int(exp[b]), int(exp[b]), self.scheme.upper_bound(b)) for b in buckets]

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / MODEL_FILE, "wb") as f:
            pickle.dump(self.model, f)
        (out / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=1))
        return out

    @classmethod
    def load(cls, model_dir: str | Path) -> "MetadataPredictor":
        d = Path(model_dir)
        if not (d / CONFIG_FILE).is_file() or not (d / MODEL_FILE).is_file():
            raise PredictorSpecError(f"predictor metadata:{model_dir}: no {CONFIG_FILE} + {MODEL_FILE} there "
                                     "(train one with `lbbench predictor train --kind metadata`)")
        raw = json.loads((d / CONFIG_FILE).read_text())
        if raw.get("kind") != "metadata":
            raise PredictorSpecError(f"predictor metadata:{model_dir}: {CONFIG_FILE} is a "
                                     f"{raw.get('kind')!r} model, not a metadata model")
        with open(d / MODEL_FILE, "rb") as f:
            model = pickle.load(f)
        return cls(MetadataModelConfig(**raw), model)


def train_metadata_model(train: Sequence[Example], scheme: BucketScheme, estimator: str = "gbdt",
                         seed: int = 0) -> MetadataPredictor:
    """Fit the estimator ('gbdt' or 'random_forest') on ``train``."""
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier  # lazy: optional extra (sklearn)

    if not train:
        raise ValueError("no training examples")
    t0 = time.perf_counter()
    tasks = sorted({e.task for e in train if e.task})
    vocab = {t: i for i, t in enumerate(tasks)}
    y = [scheme.bucket_of(e.output_tokens) for e in train]
    x = _features([e.prompt_tokens for e in train], [e.task for e in train], vocab)
    leaf = max(1, min(20, len(train) // 50))  # regularise on real corpora, still fit tiny ones
    if estimator == "gbdt":
        model = GradientBoostingClassifier(n_estimators=100, learning_rate=0.05, max_depth=3,
                                           min_samples_leaf=leaf, subsample=0.8, random_state=seed)
    elif estimator == "random_forest":
        model = RandomForestClassifier(n_estimators=200, min_samples_leaf=leaf, random_state=seed, n_jobs=1)
    else:
        raise ValueError(f"estimator must be gbdt or random_forest, got {estimator!r}")
    if len(set(y)) == 1:  # one class: every estimator would refuse or be pointless
        from sklearn.dummy import DummyClassifier  # lazy: optional extra (sklearn)

        model = DummyClassifier(strategy="most_frequent")
    model.fit(x, y)
    config = MetadataModelConfig(
        scheme=scheme.to_dict(), tasks=tasks, estimator=estimator,
        bucket_expected_tokens=bucket_expected_tokens([e.output_tokens for e in train], y, scheme),
        length_baseline=LengthBaseline.fit([e.prompt_tokens for e in train], y).to_dict(),
        majority_bucket=majority_bucket(y),
        train_fingerprints=sorted({prompt_fingerprint(e.prompt) for e in train}),
        train_seconds=time.perf_counter() - t0, num_train_examples=len(train), seed=seed)
    return MetadataPredictor(config, model)


def train_from_trace(trace: str | Path, out_dir: str | Path, *, window: tuple[float, float] | None = None,
                     profile: Any | None = None, task: str = "conversation", test_fraction: float = 0.2,
                     seed: int = 0) -> MetadataPredictor:
    """Train the metadata predictor on a trace's token counts (no prompt text needed).

    Reads the trace as ``lbbench run --trace`` does, keeps ``window`` (seconds of
    the trace's own clock), labels rows without a task ``task``, and fits on the
    same stratified training share as ``lbbench predictor train --kind metadata``
    (``bench/trace_corpus.py`` writes the rows as a corpus for that command; both
    give the same model). Saved to ``out_dir``."""
    tf = transform_trace(read_trace(trace), window=window)
    examples = [Example("", int(o), int(p), t or task)
                for p, o, t in tf.frame.select("prompt_tokens", "output_tokens", "task").iter_rows()]
    scheme = get_scheme("paper", profile)
    train, _ = stratified_split(examples, scheme, test_fraction, seed)
    model = train_metadata_model(train, scheme, seed=seed)
    model.save(out_dir)
    return model
