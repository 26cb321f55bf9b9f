"""Output-length predictors: a batch of requests in, a length bucket and an
expected token count per request out.

``load_predictor(spec)`` takes the same specs as ``lbbench run --predictor``:
``oracle | bucket_oracle | noisy:ACC | text:DIR | metadata:DIR``; ``annotate``
fills ``Request.predicted_output_tokens`` / ``predicted_bucket``. The learned
predictors (``text``, ``metadata``) import torch / scikit-learn lazily.
``load_predictor`` lives in ``registry`` (the one module that imports every
predictor); ``base`` holds the interface and the reference predictors.
"""

from .base import (
    BucketOraclePredictor,
    BucketScheme,
    NoisyPredictor,
    OraclePredictor,
    Prediction,
    Predictor,
    PredictorSpecError,
    annotate,
    equal_width_scheme,
    get_scheme,
    paper_scheme,
)
from .registry import load_predictor

__all__ = [
    "BucketOraclePredictor", "BucketScheme", "NoisyPredictor", "OraclePredictor", "Prediction",
    "Predictor", "PredictorSpecError", "annotate", "equal_width_scheme", "get_scheme", "load_predictor",
    "paper_scheme",
]
