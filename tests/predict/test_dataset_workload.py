"""Workloads sampled from a corpus."""

from __future__ import annotations

import pytest

from lbbench.predict.data import DataError
from lbbench.predict.dataset_workload import dataset_workload, requests_from_examples


def test_dataset_workload_poisson(tiny_corpus):
    reqs = dataset_workload(tiny_corpus, 2000, rate_per_s=10.0, seed=1)
    assert len(reqs) == 2000 and [r.request_id for r in reqs] == list(range(2000))
    arr = [r.arrival_s for r in reqs]
    assert arr == sorted(arr) and arr[0] > 0
    assert 9.0 < len(reqs) / arr[-1] < 11.0
    assert all(r.prompt and r.task and r.output_tokens >= 1 for r in reqs)
    assert dataset_workload(tiny_corpus, 50, 10.0, seed=1) == reqs[:50]


def test_dataset_workload_clips_to_context(tiny_corpus):
    reqs = dataset_workload(tiny_corpus, 100, 5.0, max_model_len=100)
    assert all(r.prompt_tokens + r.output_tokens <= 100 for r in reqs)


def test_bad_arguments(tiny_corpus):
    with pytest.raises(ValueError, match="^rate_per_s"):
        dataset_workload(tiny_corpus, 10, 0.0)
    with pytest.raises(DataError):
        requests_from_examples([], 10, 1.0)
