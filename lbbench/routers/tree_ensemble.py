"""Boosted trees flattened into arrays, so that a router can predict for a few rows in microseconds.

scikit-learn's ``HistGradientBoostingRegressor.predict`` validates its input and dispatches to a parallel loop on
every call: for the 4-8 rows of one routing decision that overhead is over a millisecond, past a router's decision
budget. ``TreeEnsemble`` copies the fitted trees once (off the decision path) into flat node arrays of one or more
models stacked together, and walks all rows through all trees at once, one tree level per step: ``depth`` numpy
steps per call whatever the number of trees. A leaf points at itself, so rows that reach a leaf early stay there.
The result equals the model's own raw prediction (the tests check it to 1e-9).

Only numeric splits are read (the router's features are numeric); a missing value never occurs (features are
always set), so the missing-value direction is not kept.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


class TreeEnsemble:
    """Several fitted ``HistGradientBoostingRegressor`` models, flattened; ``predict`` gives each model's raw
    prediction (the baseline plus the sum of its trees' leaf values) for every row."""

    def __init__(self, models: Sequence[Any]):
        feats, thresholds, lefts, rights, values, owners = [], [], [], [], [], []
        self.baselines = np.array([float(np.ravel(m._baseline_prediction)[0]) for m in models])
        offset = 0
        roots = []
        depth = 0
        for k, m in enumerate(models):
            for (tree,) in m._predictors:
                nodes = tree.nodes
                n = len(nodes)
                leaf = nodes["is_leaf"].astype(bool)
                if np.any(nodes["is_categorical"][~leaf]):
                    raise ValueError("TreeEnsemble reads numeric splits only")
                idx = np.arange(n)
                feats.append(np.where(leaf, 0, nodes["feature_idx"]).astype(np.int64))
                thresholds.append(np.where(leaf, np.inf, nodes["num_threshold"]).astype(np.float64))
                lefts.append(np.where(leaf, idx, nodes["left"]).astype(np.int64) + offset)
                rights.append(np.where(leaf, idx, nodes["right"]).astype(np.int64) + offset)
                values.append(np.where(leaf, nodes["value"], 0.0).astype(np.float64))
                roots.append(offset)
                owners.append(k)
                depth = max(depth, int(nodes["depth"].max()))
                offset += n
        self.num_models = len(models)
        self.feature = np.concatenate(feats) if feats else np.zeros(0, np.int64)
        self.threshold = np.concatenate(thresholds) if thresholds else np.zeros(0)
        self.left = np.concatenate(lefts) if lefts else np.zeros(0, np.int64)
        self.right = np.concatenate(rights) if rights else np.zeros(0, np.int64)
        self.value = np.concatenate(values) if values else np.zeros(0)
        self.roots = np.array(roots, dtype=np.int64)
        self.owner = np.array(owners, dtype=np.int64)
        self.depth = depth

    def _walk(self, flat: np.ndarray, width: int, node: np.ndarray) -> np.ndarray:
        """Leaf values reached from ``node`` (rows x trees) for the rows of ``flat``."""
        base = (np.arange(node.shape[0]) * width)[:, None]
        for _ in range(self.depth):
            go_left = flat[base + self.feature[node]] <= self.threshold[node]
            node = np.where(go_left, self.left[node], self.right[node])
        return self.value[node]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Raw predictions of every model, shape ``(rows, num_models)``, for ``x`` of shape ``(rows, features)``."""
        rows, width = x.shape
        flat = np.ascontiguousarray(x, dtype=np.float64).ravel()
        leaf = self._walk(flat, width, np.broadcast_to(self.roots, (rows, len(self.roots))).copy())
        out = np.empty((rows, self.num_models))
        for k in range(self.num_models):
            out[:, k] = self.baselines[k] + leaf[:, self.owner == k].sum(axis=1)
        return out

    def predict_grouped(self, x: np.ndarray, group: np.ndarray, groups: int) -> np.ndarray:
        """The models come in ``groups`` consecutive groups of equal size and tree counts (say, one per queue
        regime); each row gets only its group's models, in one walk: shape ``(rows, models per group)``."""
        rows, width = x.shape
        per = self.num_models // groups
        trees = self.roots.reshape(groups, -1)  # equal tree counts: group g's trees, model by model
        owner = self.owner.reshape(groups, -1)[0] % per
        flat = np.ascontiguousarray(x, dtype=np.float64).ravel()
        leaf = self._walk(flat, width, trees[group].copy())
        base = self.baselines.reshape(groups, per)[group]
        return base + np.stack([leaf[:, owner == k].sum(axis=1) for k in range(per)], axis=1)
