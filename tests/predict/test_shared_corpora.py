"""The public corpora kept beside the project read with the documented row
counts, and their FastChat layout is read as such.

The files live in ``../shared/datasets`` next to the repository (or the folder
in ``LBBENCH_DATASETS_DIR``). Without them the tests are skipped on a
developer machine and fail in CI (``CI`` or ``LBBENCH_REQUIRE_SHARED=1`` set).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from lbbench.predict.data import load_corpus

DATASETS = Path(os.environ.get("LBBENCH_DATASETS_DIR",
                               Path(__file__).resolve().parents[2].parent / "shared" / "datasets"))


@pytest.fixture(scope="module")
def datasets() -> Path:
    if not (DATASETS / "alpaca_eval").is_dir():
        msg = f"shared datasets not found at {DATASETS}"
        if os.environ.get("CI") or os.environ.get("LBBENCH_REQUIRE_SHARED") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return DATASETS


def test_alpaca_eval_nine_generators_of_805(datasets):
    c = load_corpus(datasets / "alpaca_eval")
    assert Counter(e.model for e in c.examples) == Counter({m: 805 for m in (
        "Meta-Llama-3-8B-Instruct", "Mistral-7B-Instruct-v0.2", "alpaca-7b", "gpt-3.5-turbo-0613",
        "gpt4_1106_preview", "llama-2-13b-chat-hf", "llama-2-7b-chat-hf", "text_davinci_003", "vicuna-7b-v1.5")})
    tasks = Counter(e.task for e in c.examples if e.model == "alpaca-7b")
    assert tasks == Counter({"selfinstruct": 252, "oasst": 188, "koala": 156, "helpful_base": 129, "vicuna": 80})


def test_vicuna_bench_and_self_instruct(datasets):
    vb = load_corpus(datasets / "vicuna_bench_2023").examples
    assert len(vb) == 480 and len({e.model for e in vb}) == 6 and len({e.prompt for e in vb}) == 80
    si = load_corpus(datasets / "self_instruct_user_oriented").examples
    assert Counter(e.model for e in si) == Counter({"text-davinci-002": 252, "text-davinci-003": 252, "human": 252})
