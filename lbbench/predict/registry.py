"""From a ``--predictor`` spec to a predictor: the one place that knows every predictor module.

``load_predictor(spec)`` takes ``oracle | bucket_oracle | noisy:ACC | text:DIR[?model=NAME&precision=P] |
metadata:DIR``. The reference predictors live in ``base``; the learned ones in ``regression`` (length
regressors), ``text`` (fine-tuned classifiers) and ``metadata``. Those modules import ``base``, never this one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import (BucketOraclePredictor, BucketScheme, NoisyPredictor, OraclePredictor, Predictor,
                   PredictorSpecError, get_scheme, paper_scheme)
from .metadata import MetadataPredictor
from .regression import LengthPredictor
from .text import TextPredictor

SPEC_HELP = "oracle | bucket_oracle | noisy:ACC | text:DIR[?model=NAME&precision=P] | metadata:DIR"


def load_predictor(spec: str, profile: Any | None = None, scheme: BucketScheme | str | None = None,
                   seed: int = 0) -> Predictor:
    """Build a predictor from a ``--predictor`` spec.

    ``text:DIR`` loads any text model in ``DIR``: a fine-tuned classifier
    (kind ``text``) or a length regressor (kind ``embed``/``bow``). Options
    after ``?``: ``model=NAME`` (the serving model a regressor conditions on;
    default: the profile's ``model``) and ``precision=fp32|bf16|int8``.

    ``scheme`` (a ``BucketScheme`` or a scheme name) applies to the reference
    predictors (default: the paper scheme for ``profile``); learned predictors
    (``text:DIR``, ``metadata:DIR``) use the scheme they were trained with.
    """
    if isinstance(scheme, str):
        scheme = get_scheme(scheme, profile)
    kind, _, arg = str(spec).partition(":")
    kind = kind.strip()
    if kind in ("oracle", "bucket_oracle", "noisy") and scheme is None:
        scheme = paper_scheme(profile)
    if kind == "oracle" and not arg:
        return OraclePredictor(scheme)
    if kind == "bucket_oracle" and not arg:
        return BucketOraclePredictor(scheme)
    if kind == "noisy":
        try:
            acc = float(arg)
        except ValueError:
            raise PredictorSpecError(f"predictor {spec!r}: noisy:ACC needs a number in [0, 1], "
                                     "e.g. noisy:0.8") from None
        return NoisyPredictor(scheme, acc, seed)
    if kind in ("text", "embed", "bow") and arg:
        path, options = _spec_options(spec, arg)
        if _saved_kind(path) in ("embed", "bow"):
            serving = options.pop("model", None) or (str(getattr(profile, "model", "")) or None)
            precision = options.pop("precision", "fp32")
            _no_more(spec, options)
            if precision not in ("fp32", "bf16", "int8"):
                raise PredictorSpecError(f"predictor {spec!r}: precision must be fp32, bf16 or int8")
            return LengthPredictor.load(path, precision=precision, serving_model=serving)
        precision = options.pop("precision", "int8")
        _no_more(spec, options)
        if precision not in ("fp32", "bf16", "int8"):
            raise PredictorSpecError(f"predictor {spec!r}: precision must be fp32, bf16 or int8")
        tp = TextPredictor.load(path, precision=precision)
        if tp.config.train.get("objective") == "task":
            raise PredictorSpecError(f"predictor {spec!r}: that directory holds a task classifier "
                                     "(kind task), not a length predictor (kind text)")
        return tp
    if kind == "metadata" and arg:
        return MetadataPredictor.load(arg)
    raise PredictorSpecError(f"predictor: unknown spec {spec!r} (expected {SPEC_HELP})")


def _spec_options(spec: str, arg: str) -> tuple[str, dict[str, str]]:
    """``DIR?model=NAME&precision=int8`` -> (``DIR``, options)."""
    path, _, query = arg.partition("?")
    options: dict[str, str] = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if not eq or key not in ("model", "precision"):
            raise PredictorSpecError(f"predictor {spec!r}: unknown option {part!r} "
                                     "(known: ?model=NAME&precision=fp32|bf16|int8)")
        options[key] = value
    return path, options


def _no_more(spec: str, options: dict[str, str]) -> None:
    if options:
        raise PredictorSpecError(f"predictor {spec!r}: option {next(iter(options))!r} does not apply "
                                 "to this kind of model")


def _saved_kind(path: str) -> str | None:
    cfg = Path(path) / "config.json"
    try:
        return json.loads(cfg.read_text()).get("kind") if cfg.is_file() else None
    except (OSError, ValueError):
        return None
