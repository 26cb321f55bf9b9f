"""Workload from a text corpus: ``lbbench run --workload dataset:FILE``.

Samples ``num_requests`` rows (with replacement, seeded) from a corpus in any
format ``predict.data`` reads, and gives them Poisson arrivals at
``rate_per_s``. Each ``Request`` carries the prompt text, the task label, the
prompt length and the true response length in tokens (so text predictors can
run on it and the simulator replays the true lengths).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Sequence

from ..core import Request
from .data import DataError, Example, load_corpus


def requests_from_examples(examples: Sequence[Example], num_requests: int, rate_per_s: float,
                           seed: int = 0, max_model_len: int | None = None) -> list[Request]:
    """``num_requests`` requests drawn from ``examples`` with Poisson arrivals.

    Output lengths are at least 1 token; with ``max_model_len`` the prompt is
    clipped so that prompt + output fits.
    """
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be > 0 requests/s, got {rate_per_s}")
    if not examples:
        raise DataError("workload dataset: the corpus has no rows")
    rng = random.Random(seed)
    t_s = 0.0
    out = []
    for i in range(num_requests):
        t_s += rng.expovariate(rate_per_s)
        e = examples[rng.randrange(len(examples))]
        output_tokens = max(1, e.output_tokens)
        prompt_tokens = max(1, e.prompt_tokens)
        if max_model_len is not None:
            output_tokens = min(output_tokens, max_model_len - 1)
            prompt_tokens = min(prompt_tokens, max_model_len - output_tokens)
        out.append(Request(request_id=i, arrival_s=t_s, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                           task=e.task, prompt=e.prompt))
    return out


def dataset_workload(path: str | Path | Sequence[str | Path], num_requests: int, rate_per_s: float,
                     seed: int = 0, models: Sequence[str] | None = None,
                     max_model_len: int | None = None) -> list[Request]:
    """Read the corpus at ``path`` (file, directory or list) and sample a workload."""
    corpus = load_corpus(path, models=models)
    return requests_from_examples(corpus.examples, num_requests, rate_per_s, seed, max_model_len)
