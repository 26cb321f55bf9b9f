"""Accuracy metrics and the two honest baselines every learned predictor is
compared with: always the majority bucket, and a model on prompt length alone.

The prompt-length baseline cuts the training prompts' token counts into
quantile bins and predicts each bin's most common output bucket; it is plain
JSON, so learned predictors also use it as their fallback for requests that
carry no prompt text.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence


def majority_bucket(buckets: Sequence[int]) -> int:
    """Most common bucket (the lowest index on ties)."""
    counts = Counter(buckets)
    return min(counts, key=lambda b: (-counts[b], b)) if counts else 0


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
