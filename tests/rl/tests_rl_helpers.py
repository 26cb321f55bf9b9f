"""Shared fixtures for the RL tests: a tiny profile and workload."""

from __future__ import annotations

import numpy as np

from lbbench.core import Request
from lbbench.profiles import Profile

PROFILE = Profile(
    name="tiny", description="", model="", hardware="", base_s=0.01, prefill_token_s=1e-4,
    decode_seq_s=1e-4, context_token_s=1e-7, num_kv_blocks=64, block_size=16, max_num_seqs=8,
    max_num_batched_tokens=512, max_model_len=512, chunked_prefill=False, grad1=3.2e-4,
    grad2=3.3e-5, epsilon=0.0, alpha=0.5, min_step_s=0.02)


def small_workload(seed: int, n: int = 40, rate: float = 20.0) -> list[Request]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return [Request(i, float(t[i]), int(rng.integers(4, 200)), int(rng.integers(1, 120)))
            for i in range(n)]


def use_small_workloads(monkeypatch) -> None:
    """Train on ``small_workload`` (the loop's validation workloads and the rollout workers' episodes)."""
    monkeypatch.setattr("lbbench.training.episodes.episode_source", lambda cfg, profile: small_workload)
    monkeypatch.setattr("lbbench.training.rounds.episode_source", lambda cfg, profile: small_workload)
