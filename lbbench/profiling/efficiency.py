"""Roofline efficiency factors fitted to measured GPU timings, and the shipped table of them.

The roofline of a transformer block's linear operations (QKV, output projection, gated MLP) on one GPU, for a
batch of ``n`` tokens, is a soft maximum of its two limits:

    t(n) = (m ** p + c(n) ** p) ** (1 / p),   m = weight bytes / (weight_bw_util x bandwidth),
                                              c(n) = 2 x weights x n / (prefill_mfu x peak FLOP/s)

``weight_bw_util`` is the share of peak bandwidth reached streaming the weights (small batches, memory-bound),
``prefill_mfu`` the share of peak FLOP/s reached by large batches (compute-bound), and the sharpness ``p`` says
how abruptly one regime hands over to the other (``p`` = infinity is the hard ``max``; the measured transition
is gradual, p ~ 1.4). :func:`fit_efficiency` fits the three to Vidur's measured timings
(:mod:`lbbench.profiling.vidur`): ``weight_bw_util`` from the 1-8 token rows, ``prefill_mfu`` from the marginal
cost between 1,024 and 4,096 tokens, ``p`` by least squares of the log error over every row up to 4,096 tokens.

``efficiency.toml`` (next to this module) holds the factors fitted on the A100 files, per tensor parallelism
and model size, with the files, commit, licence and fit error, and the held-out H100 check.
``lbbench profile efficiency`` prints it. It is a measured reference for the block GEMMs: the profiles ``lbbench
profile derive`` writes take their efficiency factors from a calibration (:mod:`lbbench.profiling.calibration`),
fitted to whole vLLM runs.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .gpus import GPU
from .vidur import BlockTimings

TABLE_PATH = Path(__file__).resolve().parent / "efficiency.toml"

#: where each factor is read from the measurements
SMALL_BATCH_MAX_TOKENS = 8
MARGINAL_FROM_TOKENS, MARGINAL_TO_TOKENS = 1024, 4096
SHARPNESS_GRID = np.round(np.arange(1.0, 8.0001, 0.01), 2)
#: Vidur's timings are fp16
MEASURED_DTYPE_BYTES = 2


def soft_roofline_s(weight_params: float, num_tokens, *, bytes_per_param: float, peak_flops: float,
                    bandwidth_bytes_s: float, prefill_mfu: float, weight_bw_util: float, sharpness: float):
    """Seconds to multiply ``num_tokens`` tokens through ``weight_params`` weights (scalar or array)."""
    n = np.asarray(num_tokens, dtype=np.float64)
    m = weight_params * bytes_per_param / (weight_bw_util * bandwidth_bytes_s)
    c = 2.0 * weight_params * n / (prefill_mfu * peak_flops)
    return soft_max(m, c, sharpness)


def soft_max(a, b, sharpness: float):
    """``(a ** p + b ** p) ** (1 / p)`` for positive ``a``, ``b`` (``p`` = infinity: ``max(a, b)``)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if math.isinf(sharpness):
        out = np.maximum(a, b)
    else:  # scaled so that large ratios do not overflow
        top = np.maximum(a, b)
        out = top * ((a / top) ** sharpness + (b / top) ** sharpness) ** (1.0 / sharpness)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class Fit:
    prefill_mfu: float
    weight_bw_util: float
    sharpness: float


def _predict(t: BlockTimings, gpu: GPU, fit: Fit, n=None):
    return soft_roofline_s(t.block_params_per_gpu, t.num_tokens if n is None else n,
                           bytes_per_param=MEASURED_DTYPE_BYTES, peak_flops=gpu.peak("fp16"),
                           bandwidth_bytes_s=gpu.memory_bw_bytes_s, prefill_mfu=fit.prefill_mfu,
                           weight_bw_util=fit.weight_bw_util, sharpness=fit.sharpness)


def measured_marginal_s(t: BlockTimings) -> float:
    """Seconds per extra token of one block, from 1,024 to 4,096 tokens."""
    return (t.at(MARGINAL_TO_TOKENS) - t.at(MARGINAL_FROM_TOKENS)) / (MARGINAL_TO_TOKENS - MARGINAL_FROM_TOKENS)


def fit_efficiency(timings: Sequence[BlockTimings], gpu: GPU) -> Fit:
    """One set of factors for ``timings`` (several models pooled) measured on ``gpu``."""
    if not timings:
        raise ValueError("no timings to fit")
    bw = [t.block_params_per_gpu * MEASURED_DTYPE_BYTES / (gpu.memory_bw_bytes_s * s)
          for t in timings for n, s in zip(t.num_tokens, t.block_s) if n <= SMALL_BATCH_MAX_TOKENS]
    if not bw:
        raise ValueError(f"no rows at {SMALL_BATCH_MAX_TOKENS} tokens or fewer")
    mfu = [2.0 * t.block_params_per_gpu / (gpu.peak("fp16") * measured_marginal_s(t)) for t in timings]
    u, f = float(np.mean(bw)), float(np.mean(mfu))
    best = None
    for p in SHARPNESS_GRID:
        err = np.concatenate([np.log(_predict(t, gpu, Fit(f, u, float(p))) / t.block_s) for t in timings])
        score = float(np.sqrt(np.mean(err ** 2)))
        if best is None or score < best[0] - 1e-12:
            best = (score, float(p))
    return Fit(prefill_mfu=round(f, 3), weight_bw_util=round(u, 3), sharpness=best[1])


def fit_errors(t: BlockTimings, gpu: GPU, fit: Fit) -> dict:
    """How far the roofline with ``fit`` is from one file's measurements (percent, + = predicted slower)."""
    err = (_predict(t, gpu, fit) / t.block_s - 1.0) * 100.0
    i = int(np.argmax(np.abs(err)))
    pow2 = np.isin(t.num_tokens, 2 ** np.arange(13))
    pred_marg = (_predict(t, gpu, fit, MARGINAL_TO_TOKENS) - _predict(t, gpu, fit, MARGINAL_FROM_TOKENS)) / (
        MARGINAL_TO_TOKENS - MARGINAL_FROM_TOKENS)
    return {"points": int(len(err)), "mean_abs_pct": round(float(np.mean(np.abs(err))), 1),
            "max_abs_pct": round(float(np.abs(err[i])), 1), "max_at_tokens": int(t.num_tokens[i]),
            "within_10pct_share": round(float(np.mean(np.abs(err) <= 10.0)), 3),
            "within_15pct_share": round(float(np.mean(np.abs(err) <= 15.0)), 3),
            "pow2_max_abs_pct": round(float(np.max(np.abs(err[pow2]))), 1) if pow2.any() else None,
            "batch1_block_s": t.at(1), "batch1_pred_s": round(float(_predict(t, gpu, fit, 1)), 9),
            "marginal_s": round(measured_marginal_s(t), 12), "marginal_pred_s": round(float(pred_marg), 12)}


# ---------------------------------------------------------------------------------------------- the shipped table
@dataclass(frozen=True)
class EfficiencyRow:
    gpu: str
    tp: int
    models: tuple[str, ...]
    block_weight_bytes_per_gpu: float
    prefill_mfu: float
    weight_bw_util: float
    sharpness: float
    files: tuple[str, ...]
    fit_error: str
    group: str = ""

    def describe(self) -> str:
        return (f"fitted on {self.gpu} TP {self.tp} ({', '.join(self.models)}): prefill MFU {self.prefill_mfu:g}, "
                f"weight-read bandwidth {self.weight_bw_util:g}, roofline sharpness {self.sharpness:g}; "
                f"{self.fit_error}")


@dataclass(frozen=True)
class EfficiencyTable:
    source: dict
    rows: tuple[EfficiencyRow, ...]
    validation: tuple[dict, ...]


def load_table(path: str | Path = TABLE_PATH) -> EfficiencyTable:
    doc = tomllib.loads(Path(path).read_text())
    rows = tuple(EfficiencyRow(gpu=r["gpu"], tp=int(r["tp"]), models=tuple(r["models"]),
                               block_weight_bytes_per_gpu=float(r["block_weight_bytes_per_gpu"]),
                               prefill_mfu=float(r["prefill_mfu"]), weight_bw_util=float(r["weight_bw_util"]),
                               sharpness=float(r["sharpness"]), files=tuple(r["files"]), fit_error=r["fit_error"],
                               group=r.get("group", ""))
                 for r in doc["fit"])
    return EfficiencyTable(source=doc["source"], rows=rows, validation=tuple(doc.get("validation", ())))
