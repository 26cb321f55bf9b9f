"""Tiny synthetic corpora for predictor tests (no shared datasets needed)."""

from __future__ import annotations

import json
import random

import pytest

TASKS = {"summarize": 40, "translate": 150, "essay": 600}
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()


def make_rows(n: int, seed: int = 0) -> list[dict]:
    """Rows whose output length is set by the task (as in the paper's mix)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        task = list(TASKS)[i % len(TASKS)]
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20)))
        prompt = f"Please {task} the following text number {i}: {words}"
        out = max(1, int(TASKS[task] * rng.uniform(0.8, 1.2)))
        rows.append({"prompt": prompt, "output_tokens": out, "task": task, "model": "m"})
    return rows


@pytest.fixture(scope="session")
def rows_factory():
    return make_rows


@pytest.fixture
def tiny_corpus(tmp_path):
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in make_rows(60)))
    return path
