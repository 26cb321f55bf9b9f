"""Accuracy metrics and the two honest baselines every learned predictor is
compared with: always the majority bucket, and a model on prompt length alone.

The prompt-length baseline cuts the training prompts' token counts into
quantile bins and predicts each bin's most common output bucket; it is plain
JSON, so learned predictors also use it as their fallback for requests that
carry no prompt text.

Ranking and calibration (what length-aware routers need): Kendall's tau-b and
Spearman's rho between predicted and true lengths, mean absolute error in
tokens, and the coverage of a predicted quantile.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:
    from .base import BucketScheme


def majority_bucket(buckets: Sequence[int]) -> int:
    """Most common bucket (the lowest index on ties)."""
    counts = Counter(buckets)
    return min(counts, key=lambda b: (-counts[b], b)) if counts else 0


def bucket_expected_tokens(output_tokens: Sequence[int], buckets: Sequence[int], scheme: BucketScheme) -> list[int]:
    """Per bucket of ``scheme``: the mean output length of the training examples in it (rounded, at least 1),
    or the scheme's own expected length where none fell in it."""
    per_bucket: dict[int, list[int]] = {}
    for n, b in zip(output_tokens, buckets):
        per_bucket.setdefault(b, []).append(n)
    expected = [round(sum(v) / len(v)) if (v := per_bucket.get(b)) else scheme.expected(b)
                for b in range(scheme.num_buckets)]
    return [max(1, v) for v in expected]


@dataclass(frozen=True)
class LengthBaseline:
    """Output bucket from prompt length alone (quantile bins, majority per bin)."""

    cut_tokens: tuple[int, ...]  # exclusive upper bounds of all bins but the last
    bin_bucket: tuple[int, ...]

    @classmethod
    def fit(cls, prompt_tokens: Sequence[int], buckets: Sequence[int], num_bins: int = 10) -> "LengthBaseline":
        if not prompt_tokens:
            return cls((), (0,))
        xs = sorted(prompt_tokens)
        cuts = sorted({xs[min(len(xs) - 1, (len(xs) * k) // num_bins)] for k in range(1, num_bins)})
        cuts = [c for c in cuts if c > xs[0]]
        per_bin: list[list[int]] = [[] for _ in range(len(cuts) + 1)]
        for x, b in zip(prompt_tokens, buckets):
            per_bin[bisect_right(cuts, x)].append(b)
        overall = majority_bucket(buckets)
        return cls(tuple(cuts), tuple(majority_bucket(v) if v else overall for v in per_bin))

    def predict(self, prompt_tokens: Sequence[int]) -> list[int]:
        return [self.bin_bucket[bisect_right(self.cut_tokens, x)] for x in prompt_tokens]

    def to_dict(self) -> dict[str, Any]:
        return {"cut_tokens": list(self.cut_tokens), "bin_bucket": list(self.bin_bucket)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LengthBaseline":
        return cls(tuple(int(x) for x in d["cut_tokens"]), tuple(int(x) for x in d["bin_bucket"]))


def accuracy(true: Sequence[Any], pred: Sequence[Any]) -> float:
    if len(true) != len(pred):
        raise ValueError("true and pred differ in length")
    return sum(t == p for t, p in zip(true, pred)) / len(true) if true else float("nan")


def bucket_metrics(true: Sequence[int], pred: Sequence[int], num_buckets: int) -> dict[str, Any]:
    """Accuracy, per-bucket precision/recall/support and the confusion matrix
    (rows = true bucket, columns = predicted bucket)."""
    confusion = [[0] * num_buckets for _ in range(num_buckets)]
    for t, p in zip(true, pred):
        confusion[t][p] += 1
    per_bucket = []
    for b in range(num_buckets):
        tp = confusion[b][b]
        support = sum(confusion[b])
        predicted = sum(row[b] for row in confusion)
        per_bucket.append({"bucket": b, "support": support,
                           "precision": tp / predicted if predicted else None,
                           "recall": tp / support if support else None})
    return {"accuracy": accuracy(true, pred), "per_bucket": per_bucket, "confusion": confusion}


# --------------------------------------------------------------------------- ranking and calibration


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (ties in either variable corrected for); NaN when
    fewer than two rows or either side is constant. O(n^2), chunked."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError("x and y differ in length")
    n = len(a)
    if n < 2:
        return float("nan")
    concordant_minus_discordant = 0.0
    tied_x = tied_y = 0.0  # pairs tied in x (resp. y), counted over i < j
    chunk = max(1, 2_000_000 // n)
    for s in range(0, n, chunk):
        da = np.sign(a[s:s + chunk, None] - a[None, :])
        db = np.sign(b[s:s + chunk, None] - b[None, :])
        concordant_minus_discordant += float((da * db).sum())
        tied_x += float((da == 0).sum())
        tied_y += float((db == 0).sum())
    pairs = n * (n - 1)  # ordered pairs; the diagonal is tied in both and is removed below
    tied_x -= n
    tied_y -= n
    denom = ((pairs - tied_x) * (pairs - tied_y)) ** 0.5
    return concordant_minus_discordant / denom if denom > 0 else float("nan")


def average_ranks(x: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    ranks = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation of the average ranks; NaN when undefined."""
    if len(x) != len(y):
        raise ValueError("x and y differ in length")
    if len(x) < 2:
        return float("nan")
    rx, ry = average_ranks(x), average_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else float("nan")


def mae(true: Sequence[float], pred: Sequence[float]) -> float:
    if len(true) != len(pred):
        raise ValueError("true and pred differ in length")
    return sum(abs(t - p) for t, p in zip(true, pred)) / len(true) if true else float("nan")


def coverage(true: Sequence[float], upper: Sequence[float]) -> float:
    """Share of rows whose true value is at or below the predicted quantile
    (a calibrated p90 covers 0.90)."""
    if len(true) != len(upper):
        raise ValueError("true and upper differ in length")
    return sum(t <= u for t, u in zip(true, upper)) / len(true) if true else float("nan")
