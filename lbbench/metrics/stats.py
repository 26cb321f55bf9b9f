"""Bootstrap confidence intervals for the change of a latency statistic between two runs.

Both sides are given per seed as arrays of per-request values (completed requests only),
keyed by ``request_id``. The statistic of one side is computed per seed and averaged over
seeds, as in ``summary.summarize``.

- **Paired** (the two sides share seeds): per shared seed the requests are aligned on
  ``request_id`` (same arrivals), and one resample of request indices is applied to both
  sides, so the interval reflects the difference, not the two spreads. The change is the
  mean over seeds of ``100 * (candidate - baseline) / baseline``.
- **Unpaired** (no shared seed): each side is resampled on its own; the change is
  ``100 * (candidate - baseline) / baseline`` of the seed-averaged statistics.

Resampling is hierarchical: seeds with replacement, then requests within each seed. Within a
seed, requests are resampled in contiguous blocks of about sqrt(n) requests in arrival order
(circular block bootstrap), because latencies of neighbouring requests are correlated
(they queue behind the same bursts); resampling single requests would make the interval
too narrow. The interval is the percentile interval of ``num_resamples`` replicates.

With few seeds the seed level of a bootstrap is crude. So for *unpaired* comparisons with
at least two seeds on each side, the reported interval is the wider of the bootstrap
interval and a Welch t interval over the per-seed values: a regression gate should not
fail on the seed-to-seed spread of two independent samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import math

import numpy as np

#: Largest number of (replicate x request) cells materialised at once.
_CELLS_PER_CHUNK = 4_000_000


@dataclass(frozen=True)
class Stat:
    """How a metric is computed from one seed's per-request values."""

    kind: str  # "mean" or "quantile"
    q: float = 0.5

    def __call__(self, values: np.ndarray, axis: int = -1) -> np.ndarray:
        if self.kind == "mean":
            return values.mean(axis=axis)
        if self.kind == "quantile":
            return np.quantile(values, self.q, axis=axis)
        raise ValueError(f"unknown statistic {self.kind!r}")


MEAN = Stat("mean")


@dataclass(frozen=True)
class Change:
    """Relative change (percent) from baseline to candidate with its interval."""

    baseline: float
    candidate: float
    change_pct: float
    ci_low_pct: float
    ci_high_pct: float
    paired: bool
    num_seeds: int

    @property
    def excludes_zero(self) -> bool:
        return self.ci_low_pct > 0 or self.ci_high_pct < 0


@dataclass(frozen=True)
class Side:
    """One side of a comparison: per seed, request ids, values and an optional scale
    (e.g. ``completed / span`` turns a mean of tokens into tokens per second)."""

    ids: Mapping[int, np.ndarray]
    values: Mapping[int, np.ndarray]
    scale: Mapping[int, float] | None = None

    def seeds(self) -> list[int]:
        return sorted(s for s, v in self.values.items() if len(v) > 0)

    def scale_of(self, seed: int) -> float:
        return 1.0 if self.scale is None else float(self.scale[seed])


def _boot_stat(arrays: list[np.ndarray], stat: Stat, num: int,
               rng: np.random.Generator) -> list[np.ndarray]:
    """``num`` replicates of ``stat`` for each array, resampling the same indices in all."""
    n = len(arrays[0])
    block = _block_len(n)
    # circular blocks without a modulo: index into the array extended by its first block
    ext = [np.concatenate([a, a[:block]]) for a in arrays]
    out = [np.empty(num) for _ in arrays]
    chunk = max(1, _CELLS_PER_CHUNK // max(n, 1))
    for start in range(0, num, chunk):
        stop = min(num, start + chunk)
        idx = block_indices(n, stop - start, rng, block, wrap=False)
        for o, a in zip(out, ext):
            o[start:stop] = stat(a[idx], axis=1)
    return out


def _block_len(n: int) -> int:
    return max(1, int(round(math.sqrt(n))))


def block_indices(n: int, num: int, rng: np.random.Generator, block: int | None = None,
                  wrap: bool = True) -> np.ndarray:
    """``num`` circular-block-bootstrap index rows of length ``n`` (blocks of ~sqrt(n)).

    With ``wrap=False`` indices run past ``n - 1`` (up to ``n + block - 2``) and are meant
    for an array extended by its first ``block`` values.
    """
    block = _block_len(n) if block is None else max(1, min(block, n))
    num_blocks = -(-n // block)
    starts = rng.integers(0, n, size=(num, num_blocks, 1), dtype=np.int32)
    idx = starts + np.arange(block, dtype=np.int32)
    if wrap:
        idx %= n
    return idx.reshape(num, num_blocks * block)[:, :n]


def _percentile_ci(boot: np.ndarray, level: float) -> tuple[float, float]:
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def _align(base: Side, cand: Side, seed: int) -> tuple[np.ndarray, np.ndarray]:
    b_ids, c_ids = base.ids[seed], cand.ids[seed]
    common, bi, ci = np.intersect1d(b_ids, c_ids, assume_unique=False, return_indices=True)
    if len(common) == 0:
        raise ValueError(f"seed {seed}: no request completed on both sides")
    return base.values[seed][bi], cand.values[seed][ci]


def bootstrap_change(base: Side, cand: Side, stat: Stat = MEAN, num_resamples: int = 1000,
                     level: float = 0.95, seed: int = 0) -> Change:
    """Relative change of ``stat`` from ``base`` to ``cand`` with a bootstrap interval."""
    rng = np.random.default_rng(seed)
    shared = sorted(set(base.seeds()) & set(cand.seeds()))
    if shared:
        per_seed_b, per_seed_c, boots = [], [], []
        for s in shared:
            b, c = _align(base, cand, s)
            sb, sc = base.scale_of(s), cand.scale_of(s)
            vb, vc = float(stat(b)) * sb, float(stat(c)) * sc
            per_seed_b.append(vb)
            per_seed_c.append(vc)
            rb, rc = _boot_stat([b, c], stat, num_resamples, rng)
            boots.append(100.0 * (rc * sc - rb * sb) / (rb * sb))
        point = float(np.mean([100.0 * (c - b) / b for b, c in zip(per_seed_b, per_seed_c)]))
        mat = np.vstack(boots)  # seeds x replicates
        pick = rng.integers(0, len(shared), size=(num_resamples, len(shared)))
        boot = mat[pick, np.arange(num_resamples)[:, None]].mean(axis=1)
        lo, hi = _percentile_ci(boot, level)
        return Change(float(np.mean(per_seed_b)), float(np.mean(per_seed_c)), point, lo, hi,
                      True, len(shared))

    def side_boot(side: Side) -> tuple[float, np.ndarray]:
        seeds = side.seeds()
        if not seeds:
            raise ValueError("no completed requests to compare")
        vals = [float(stat(side.values[s])) * side.scale_of(s) for s in seeds]
        mat = np.vstack([_boot_stat([side.values[s]], stat, num_resamples, rng)[0] * side.scale_of(s)
                         for s in seeds])
        pick = rng.integers(0, len(seeds), size=(num_resamples, len(seeds)))
        return float(np.mean(vals)), mat[pick, np.arange(num_resamples)[:, None]].mean(axis=1)

    vb, bb = side_boot(base)
    vc, bc = side_boot(cand)
    lo, hi = _percentile_ci(100.0 * (bc - bb) / bb, level)
    b_seed = [float(stat(base.values[s])) * base.scale_of(s) for s in base.seeds()]
    c_seed = [float(stat(cand.values[s])) * cand.scale_of(s) for s in cand.seeds()]
    if len(b_seed) >= 2 and len(c_seed) >= 2:
        w_lo, w_hi = welch_change_ci(b_seed, c_seed, level)
        lo, hi = min(lo, w_lo), max(hi, w_hi)
    return Change(vb, vc, 100.0 * (vc - vb) / vb, lo, hi, False,
                  min(len(base.seeds()), len(cand.seeds())))


def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom (numeric; no SciPy needed)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:  # 0.5 + integral of the density over [0, x]
        grid = np.linspace(0.0, x, 4001)
        dens = np.exp(log_c - (df + 1) / 2 * np.log1p(grid * grid / df))
        return 0.5 + float(np.sum((dens[1:] + dens[:-1]) * np.diff(grid)) / 2)

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def welch_change_ci(base: list[float], cand: list[float], level: float = 0.95) -> tuple[float, float]:
    """Welch t interval of ``100 * (mean(cand) - mean(base)) / mean(base)`` from per-seed values."""
    b, c = np.asarray(base, float), np.asarray(cand, float)
    vb, vc = b.var(ddof=1) / len(b), c.var(ddof=1) / len(c)
    se = math.sqrt(vb + vc)
    mb = float(b.mean())
    diff = float(c.mean()) - mb
    if se == 0:
        return 100.0 * diff / mb, 100.0 * diff / mb
    df = (vb + vc) ** 2 / (vb ** 2 / (len(b) - 1) + vc ** 2 / (len(c) - 1))
    t = t_quantile(0.5 + level / 2, df)
    return 100.0 * (diff - t * se) / mb, 100.0 * (diff + t * se) / mb


def side_from_rows(seeds: np.ndarray, ids: np.ndarray, values: np.ndarray,
                   scale: Callable[[int], float] | None = None) -> Side:
    """Group flat (seed, request_id, value) arrays into a ``Side``."""
    order = np.lexsort((ids, seeds))  # by seed, then request id (arrival order)
    seeds, ids, values = seeds[order], ids[order], values[order]
    uniq, starts = np.unique(seeds, return_index=True)
    bounds = list(starts) + [len(seeds)]
    id_map, val_map = {}, {}
    for k, s in enumerate(uniq):
        a, b = bounds[k], bounds[k + 1]
        id_map[int(s)] = ids[a:b]
        val_map[int(s)] = values[a:b].astype(float)
    sc = None if scale is None else {int(s): scale(int(s)) for s in uniq}
    return Side(id_map, val_map, sc)
