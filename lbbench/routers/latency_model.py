"""llm-d's latency model: boosted trees on stratified samples, with separate queued and unqueued sub-models.

What ``llm-d/llm-d-latency-predictor`` ``training/training_server.py`` (commit
``04e44cd801d5d79a215d99109081b6afb870b87e``, Apache-2.0) does, and lbbench keeps:

- **Stratified samples.** Each sample goes to a bucket keyed by (waiting requests: 0, 1-2, 3-5, 6-10, 11+;
  KV-cache usage in 5 % steps; prefix-cache score in quarters): 5 x 20 x 4 buckets, each keeping its latest
  ``bucket_size`` samples (``LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET``, 500), so that a burst of one regime
  does not wash the others out of the training set.
- **Queue-gated sub-models.** Once both the unqueued (no request waiting) and the queued samples of every target
  number ``min_split`` (``LATENCY_MIN_SAMPLES_FOR_ENSEMBLE_SPLIT``, 200), each target gets two models, one per
  regime, and a prediction uses the one of the instance's regime; before that one model per target on all samples.
- **Boosted trees.** llm-d fits XGBoost (200 trees of depth 6, learning rate 0.05, ``min_child_weight`` 5,
  L2 0.1, histogram method); lbbench fits scikit-learn's ``HistGradientBoostingRegressor`` of the same shape with
  fewer, larger steps (``max_iter`` 60, learning rate 0.12, depth 6, ``min_samples_leaf`` 5, L2 0.1: the refits run
  on the simulator's thread), and predicts through ``TreeEnsemble`` (sklearn's own ``predict`` costs over a
  millisecond per decision; see ``bench/bench_predicted_latency.py``).
- **First fit** once every target has ``min_samples`` samples (``LATENCY_MIN_SAMPLES_FOR_RETRAIN``, 100 in
  llm-d's deployment); llm-d then retrains every ``LATENCY_RETRAINING_INTERVAL_SEC`` (10 s in its chart), lbbench
  after every ``refit_every`` completions (the router decides when; see ``predicted_latency``).

The loss: llm-d's chart sets ``LATENCY_OBJECTIVE_TYPE: mean`` (squared error, in milliseconds; its code's default
is a p90 pinball loss). lbbench's default ``relative`` fits the logarithm of the latency with squared error, which
minimises relative error (the MAPE llm-d's results quote), and predicts its exponential; ``squared`` fits seconds
with squared error, as llm-d's chart does. llm-d also holds out 10 % of its samples to score each model; lbbench
trains on all of them and scores the predictions the router acted on instead.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

from .tree_ensemble import TreeEnsemble

LOSSES = ("relative", "squared")
#: ``HistGradientBoostingRegressor`` settings (see the module docstring)
TREE_PARAMS = dict(max_iter=50, learning_rate=0.15, max_depth=5, min_samples_leaf=5, l2_regularization=0.1,
                   early_stopping=False, random_state=0)


def queue_bucket(num_waiting: float) -> int:
    """llm-d's waiting-request bucket: 0, 1-2, 3-5, 6-10, 11+."""
    w = int(num_waiting)
    return 0 if w <= 0 else 1 if w <= 2 else 2 if w <= 5 else 3 if w <= 10 else 4


def bucket_key(num_waiting: float, kv_usage: float, prefix_score: float) -> tuple[int, int, int]:
    """(queue bucket, KV-usage bucket of 5 %, prefix-score quarter)."""
    kv = min(max(kv_usage, 0.0), 1.0)
    ps = min(max(prefix_score, 0.0), 1.0)
    return queue_bucket(num_waiting), min(int(kv * 20), 19), min(int(ps * 4), 3)


class LatencyModel:
    """Training samples and fitted models for ``targets`` (e.g. ``("ttft", "tpot")``); a sample of a target is a
    feature row, its bucket key and the observed latency (seconds, > 0)."""

    def __init__(self, targets: Sequence[str], loss: str = "relative", bucket_size: int = 500,
                 min_samples: int = 100, min_split: int = 200):
        self.targets = tuple(targets)
        self.loss = loss
        self.bucket_size = bucket_size
        self.min_samples = min_samples
        self.min_split = min_split
        self.buckets: dict[str, dict[tuple[int, int, int], deque]] = {t: {} for t in self.targets}
        self.ensemble: TreeEnsemble | None = None
        self.gated = False
        self.num_fits = 0

    def add(self, target: str, x: Sequence[float], key: tuple[int, int, int], y: float) -> None:
        b = self.buckets[target].get(key)
        if b is None:
            b = self.buckets[target][key] = deque(maxlen=self.bucket_size)
        b.append((tuple(x), y))

    def num_samples(self, target: str, queued: bool | None = None) -> int:
        return sum(len(b) for k, b in self.buckets[target].items() if queued is None or (k[0] > 0) == queued)

    def ready(self) -> bool:
        """Every target has ``min_samples`` samples: a fit is possible."""
        return all(self.num_samples(t) >= self.min_samples for t in self.targets)

    def _samples(self, target: str, queued: bool | None) -> tuple[np.ndarray, np.ndarray]:
        rows = [s for k, b in self.buckets[target].items() if queued is None or (k[0] > 0) == queued for s in b]
        x = np.array([r[0] for r in rows], dtype=float)
        y = np.array([r[1] for r in rows], dtype=float)
        return x, (np.log(y) if self.loss == "relative" else y)

    def fit(self) -> None:
        """Refit every target's model(s) on the samples held now (gated when every regime has ``min_split``)."""
        from sklearn.ensemble import HistGradientBoostingRegressor  # lazy: scikit-learn is the learn extra
        from threadpoolctl import threadpool_limits  # lazy: installed with scikit-learn

        gated = all(self.num_samples(t, q) >= self.min_split for t in self.targets for q in (False, True))
        models = []
        with threadpool_limits(1):  # deterministic and polite on a shared host
            for queued in ((False, True) if gated else (None,)):  # unqueued targets, then queued ones
                for t in self.targets:
                    x, y = self._samples(t, queued)
                    models.append(HistGradientBoostingRegressor(**TREE_PARAMS).fit(x, y))
        self.ensemble = TreeEnsemble(models)
        self.gated = gated
        self.num_fits += 1

    @property
    def fitted(self) -> bool:
        return self.ensemble is not None

    def predict(self, x: np.ndarray, queued: np.ndarray) -> np.ndarray:
        """Predicted latency (seconds), shape ``(rows, targets)``, each row from its regime's model (``queued``:
        one bool per row) once the models are gated."""
        assert self.ensemble is not None
        if self.gated:  # each row walks only its regime's trees
            raw = self.ensemble.predict_grouped(x, queued.astype(np.intp), 2)
        else:
            raw = self.ensemble.predict(x)
        return np.exp(raw) if self.loss == "relative" else np.maximum(raw, 1e-5)

    def describe(self) -> str:
        n = ", ".join(f"{t} {self.num_samples(t)}" for t in self.targets)
        kind = "queued/unqueued sub-models" if self.gated else "one model per target"
        return f"{kind}, samples {n}"


def mape(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Mean absolute percentage error (%) of (predicted, actual) pairs."""
    return 100.0 * sum(abs(p - a) / a for p, a in pairs) / len(pairs) if pairs else None


def slo_f1(pairs: Sequence[tuple[float, float]], slo_s: float) -> float | None:
    """F1 of predicting "misses the SLO" (latency > ``slo_s``) from the predicted latency; None when neither the
    predictions nor the actuals ever miss."""
    tp = sum(1 for p, a in pairs if p > slo_s and a > slo_s)
    fp = sum(1 for p, a in pairs if p > slo_s >= a)
    fn = sum(1 for p, a in pairs if a > slo_s >= p)
    return None if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)
