"""The training loop reproduces a recorded run: a fixed-seed, 2-worker run through every phase
(a kv_gate teacher, behaviour cloning, a DAgger round, Double-DQN fine-tuning with exploration),
its training curve and learning curve against ``data/train_golden.json``, recorded before the
two training loops became one. A change that alters what training computes fails here; one that
means to (a new update rule, say) records the file anew and says why in its commit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from lbbench.training.config import TrainConfig
from lbbench.training.rounds import train

GOLDEN = Path(__file__).parent / "data" / "train_golden.json"

CONFIG = TrainConfig(router="wgrl", profile="llama2-7b-v100", instances=2, requests=40, rate=10.0, episodes=2,
                     explore_episodes=2, epsilon_start=0.3, learning_starts=16, batch_size=32, buffer_size=5000,
                     target_every=50, val_seeds=1, network="shared", kv_features=True, max_defer_s=30.0,
                     eval_every=2, teacher="kv_gate", bc_episodes=2, dagger_rounds=1, imitation_updates=40,
                     reward_centering=True, workers=2, seed=3)


def _same(got: pl.DataFrame, want: dict) -> None:
    for col, values in want.items():
        have = got[col].to_list()
        if isinstance(values[0], str) or col in ("episode", "updates", "preemptions"):
            assert have == values, col
        else:  # floats; null is NaN (JSON has no NaN)
            np.testing.assert_allclose(have, [np.nan if v is None else v for v in values], rtol=1e-9,
                                       equal_nan=True, err_msg=col)


def test_a_recorded_two_worker_run_is_reproduced(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    curve = train(CONFIG, tmp_path, progress=False)
    _same(curve, golden["curve"])
    _same(pl.read_parquet(tmp_path / "learning_curve.parquet"), golden["learning_curve"])
