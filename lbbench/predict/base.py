"""Output-length predictor interface, bucket schemes and the reference predictors.

A predictor takes a batch of ``Request`` objects and returns one
``Prediction(bucket, expected_tokens)`` per request. Buckets come from a
``BucketScheme`` (edges in tokens). Two schemes are built in:

* ``paper``: the completion-time buckets of Jain et al. (0-0.5 s, 0.5-2 s,
  2-8 s, 8-32 s, "and so forth"). We read "and so forth" as the geometric x4
  series the first four edges follow (0.5, 2, 8, 32, 128, ... seconds) and stop
  adding edges once an edge reaches the token cap (the profile's
  ``max_model_len``). Seconds become tokens with ``profile.decode_tokens_per_s``
  (a single stream's decode rate); without a profile we use 50 tokens/s and a
  4096-token cap (Llama-2-7B's context, the paper's model).
* ``equal250``: equal 250-token buckets (0-250, 250-500, ...) up to the cap.

The last bucket is open-ended; ``upper_bound`` of it is the scheme's
``cap_tokens`` (a response can never be longer than the model's context).

Reference predictors (the upper bounds the learned ones are compared with):
``OraclePredictor`` (true length), ``BucketOraclePredictor`` (the upper bound
of the true bucket) and ``NoisyPredictor`` (the true bucket with probability
``accuracy``, else a neighbouring one).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Sequence, runtime_checkable

from ..core import Request
from ..errors import InputError

#: Decode rate (tokens/s) used for the paper scheme when no profile is given.
DEFAULT_DECODE_TOKENS_PER_S = 50.0
#: Token cap of the open last bucket when no profile is given (Llama-2 context).
DEFAULT_CAP_TOKENS = 4096
#: The paper's first completion-time edge (seconds) and the geometric ratio.
PAPER_FIRST_EDGE_S = 0.5
PAPER_RATIO = 4.0


class PredictorSpecError(InputError):
    """A ``--predictor`` spec or a saved predictor directory is unusable."""


@dataclass(kw_only=True)
class TrainedModelConfig:
    """What every trained predictor saves beside its weights (``config.json``)."""

    scheme: dict[str, Any]
    tasks: list[str]
    bucket_expected_tokens: list[int]
    length_baseline: dict[str, Any]
    majority_bucket: int
    train_fingerprints: list[str] = field(default_factory=list)
    train_seconds: float = 0.0
    num_train_examples: int = 0


@dataclass(frozen=True, slots=True)
class Prediction:
    """One request's predicted output length: its bucket, a point estimate
    (the expected length, what routers sum as work) and two quantiles of its
    distribution (``p50_tokens``, ``p90_tokens``; ``None`` when the predictor
    has no distribution, read them through ``p50`` / ``p90``)."""

    bucket: int
    expected_tokens: int
    p50_tokens: int | None = None
    p90_tokens: int | None = None

    @property
    def p50(self) -> int:
        return self.expected_tokens if self.p50_tokens is None else self.p50_tokens

    @property
    def p90(self) -> int:
        return self.expected_tokens if self.p90_tokens is None else self.p90_tokens


@dataclass(frozen=True)
class BucketScheme:
    """Output-length buckets. ``edges_tokens`` are exclusive upper bounds of all
    but the last bucket; the last bucket is open and capped at ``cap_tokens``."""

    name: str
    edges_tokens: tuple[int, ...]
    cap_tokens: int

    def __post_init__(self) -> None:
        e = self.edges_tokens
        if any(x <= 0 for x in e) or any(b <= a for a, b in zip(e, e[1:])):
            raise ValueError(f"bucket scheme {self.name!r}: edges must be positive and increasing: {e}")
        if e and self.cap_tokens <= e[-1]:
            raise ValueError(f"bucket scheme {self.name!r}: cap_tokens {self.cap_tokens} must exceed "
                             f"the last edge {e[-1]}")

    @property
    def num_buckets(self) -> int:
        return len(self.edges_tokens) + 1

    def bucket_of(self, tokens: int) -> int:
        for i, edge in enumerate(self.edges_tokens):
            if tokens < edge:
                return i
        return len(self.edges_tokens)

    def lower_bound(self, bucket: int) -> int:
        self._check(bucket)
        return 0 if bucket == 0 else self.edges_tokens[bucket - 1]

    def upper_bound(self, bucket: int) -> int:
        """Exclusive upper edge; for the open last bucket, ``cap_tokens``."""
        self._check(bucket)
        return self.edges_tokens[bucket] if bucket < len(self.edges_tokens) else self.cap_tokens

    def expected(self, bucket: int) -> int:
        """Midpoint of the bucket (at least 1 token)."""
        return max(1, (self.lower_bound(bucket) + self.upper_bound(bucket)) // 2)

    def labels(self) -> list[str]:
        return [f"{self.lower_bound(b)}-{self.upper_bound(b)}" if b < len(self.edges_tokens)
                else f">={self.lower_bound(b)}" for b in range(self.num_buckets)]

    def _check(self, bucket: int) -> None:
        if not 0 <= bucket < self.num_buckets:
            raise IndexError(f"bucket {bucket} out of range for scheme {self.name!r} "
                             f"({self.num_buckets} buckets)")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "edges_tokens": list(self.edges_tokens), "cap_tokens": self.cap_tokens}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BucketScheme":
        return cls(str(d["name"]), tuple(int(x) for x in d["edges_tokens"]), int(d["cap_tokens"]))


def _rate_and_cap(profile: Any | None) -> tuple[float, int]:
    if profile is None:
        return DEFAULT_DECODE_TOKENS_PER_S, DEFAULT_CAP_TOKENS
    return float(profile.decode_tokens_per_s), int(profile.max_model_len)


def paper_scheme(profile: Any | None = None, decode_tokens_per_s: float | None = None,
                 cap_tokens: int | None = None) -> BucketScheme:
    """The paper's completion-time buckets (0.5 s, 2 s, 8 s, 32 s, ... x4) in tokens."""
    rate, cap = _rate_and_cap(profile)
    rate = decode_tokens_per_s or rate
    cap = cap_tokens or cap
    edges: list[int] = []
    edge_s = PAPER_FIRST_EDGE_S
    while True:
        tok = max(1, round(edge_s * rate))
        if tok >= cap:
            break
        if not edges or tok > edges[-1]:
            edges.append(tok)
        edge_s *= PAPER_RATIO
    return BucketScheme("paper", tuple(edges), cap)


def equal_width_scheme(profile: Any | None = None, width_tokens: int = 250,
                       cap_tokens: int | None = None) -> BucketScheme:
    """Equal ``width_tokens`` buckets up to the cap (the last one open)."""
    cap = cap_tokens or _rate_and_cap(profile)[1]
    edges = tuple(range(width_tokens, cap, width_tokens))
    return BucketScheme(f"equal{width_tokens}", edges, cap)


SCHEMES = ("paper", "equal250")


def get_scheme(name: str, profile: Any | None = None) -> BucketScheme:
    if name == "paper":
        return paper_scheme(profile)
    if name == "equal250":
        return equal_width_scheme(profile, 250)
    raise PredictorSpecError(f"scheme: unknown bucket scheme {name!r} (known: {', '.join(SCHEMES)})")


# --------------------------------------------------------------------------- protocol


@runtime_checkable
class Predictor(Protocol):
    """Batch in, one ``Prediction`` per request out (same order)."""

    name: str
    scheme: BucketScheme

    def predict(self, requests: Sequence[Request]) -> list[Prediction]:
        ...


class OraclePredictor:
    """Knows the true output length."""

    def __init__(self, scheme: BucketScheme):
        self.scheme = scheme
        self.name = "oracle"

    def predict(self, requests: Sequence[Request]) -> list[Prediction]:
        return [Prediction(self.scheme.bucket_of(r.output_tokens), r.output_tokens, r.output_tokens, r.output_tokens)
                for r in requests]


class BucketOraclePredictor:
    """Knows the true bucket; predicts its upper bound (a conservative estimate)."""

    def __init__(self, scheme: BucketScheme):
        self.scheme = scheme
        self.name = "bucket_oracle"

    def predict(self, requests: Sequence[Request]) -> list[Prediction]:
        out = []
        for r in requests:
            b = self.scheme.bucket_of(r.output_tokens)
            ub = self.scheme.upper_bound(b)
            out.append(Prediction(b, ub, ub, ub))
        return out


#: Relative weight of moving a mislabelled request by 1 and by 2 buckets.
NOISE_OFFSET_WEIGHTS: dict[int, float] = {-1: 0.4, 1: 0.4, -2: 0.1, 2: 0.1}


class NoisyPredictor:
    """A predictor of a given accuracy: keeps the true bucket with probability
    ``accuracy``; otherwise moves it to a neighbouring bucket (±1 with weight
    0.4 each, ±2 with 0.1 each, renormalised over the buckets that exist).
    The expected length is that bucket's upper bound, as for ``bucket_oracle``.
    Deterministic per ``(seed, request_id)``, independent of batch order.
    """

    def __init__(self, scheme: BucketScheme, accuracy: float, seed: int = 0):
        if not 0.0 <= accuracy <= 1.0:
            raise PredictorSpecError(f"predictor noisy:ACC: accuracy must be in [0, 1], got {accuracy}")
        self.scheme = scheme
        self.accuracy = float(accuracy)
        self.seed = int(seed)
        self.name = f"noisy:{accuracy:g}"

    def bucket_for(self, request_id: int, true_bucket: int) -> int:
        rng = random.Random(f"lbbench-noisy:{self.seed}:{request_id}")
        if rng.random() < self.accuracy:
            return true_bucket
        n = self.scheme.num_buckets
        options = [(o, w) for o, w in NOISE_OFFSET_WEIGHTS.items() if 0 <= true_bucket + o < n]
        if not options:
            return true_bucket
        x = rng.random() * sum(w for _, w in options)
        for o, w in options:
            x -= w
            if x < 0:
                return true_bucket + o
        return true_bucket + options[-1][0]

    def predict(self, requests: Sequence[Request]) -> list[Prediction]:
        out = []
        for r in requests:
            b = self.bucket_for(r.request_id, self.scheme.bucket_of(r.output_tokens))
            ub = self.scheme.upper_bound(b)
            out.append(Prediction(b, ub, ub, ub))
        return out


# --------------------------------------------------------------------------- loading / annotating

def annotate(requests: Sequence[Request], predictor: Predictor, batch_size: int = 64) -> list[Request]:
    """Copies of ``requests`` with ``predicted_output_tokens`` / ``predicted_bucket``
    filled in from ``predictor`` (called in batches of ``batch_size``)."""
    reqs = list(requests)
    out: list[Request] = []
    for i in range(0, len(reqs), batch_size):
        batch = reqs[i:i + batch_size]
        preds = predictor.predict(batch)
        if len(preds) != len(batch):
            raise RuntimeError(f"predictor {predictor.name!r} returned {len(preds)} predictions "
                               f"for {len(batch)} requests")
        out.extend(replace(r, predicted_output_tokens=int(p.expected_tokens), predicted_bucket=int(p.bucket))
                   for r, p in zip(batch, preds))
    return out
