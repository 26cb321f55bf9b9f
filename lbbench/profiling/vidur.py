"""Measured per-operation GPU timings in Vidur's profiling format, read as a transformer block's linear time.

Vidur (github.com/microsoft/vidur, MIT licence) timed every operation of a transformer block outside attention
on real GPUs and publishes them as ``data/profiling/compute/<gpu>/<org>/<model>/mlp.csv``: one row per
(``num_tokens``, ``num_tensor_parallel_workers``) with ``time_stats.<op>.{min,max,mean,median,std}`` in
milliseconds, and the block's shape (``n_head``, ``n_kv_head``, ``n_embd``, ``n_expanded_embd``).

:func:`read_block_timings` turns one file into the *block-linear time* of one GPU at each token count: the sum
of the medians of the operations a decoder block runs once (two RMS norms, the fused QKV projection, rotary
embedding, the output projection, the fused gate+up projection, the activation, the down projection) plus two
residual adds, in seconds. Attention itself (``attention.csv``) is not included. Rows repeated for the same
token count and tensor parallelism are averaged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ..errors import InputError

#: the operations summed, with how many times a block runs each
BLOCK_OPS: dict[str, int] = {
    "input_layernorm": 1, "attn_pre_proj": 1, "attn_rope": 1, "attn_post_proj": 1,
    "post_attention_layernorm": 1, "mlp_up_proj": 1, "mlp_act": 1, "mlp_down_proj": 1, "add": 2,
}
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens", "num_tensor_parallel_workers")


class MeasurementError(InputError):
    """A timing file that cannot be read as Vidur's mlp.csv (the message names the file and the column)."""


@dataclass(frozen=True)
class BlockTimings:
    """One file's block-linear time at one tensor parallelism, by token count."""

    path: str
    tp: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    num_tokens: np.ndarray  # ascending
    block_s: np.ndarray  # seconds per block on one GPU

    @property
    def block_params_per_gpu(self) -> float:
        """Weights one GPU multiplies per block: QKV, output projection and the gated MLP, split over TP."""
        h, hd = self.hidden_size, self.hidden_size // self.num_heads
        qkv = h * (self.num_heads + 2 * self.num_kv_heads) * hd
        out = self.num_heads * hd * h
        mlp = 3 * h * self.intermediate_size
        return (qkv + out + mlp) / self.tp

    def at(self, num_tokens: int) -> float:
        """The measured block time at exactly ``num_tokens`` (an error names the file when it has no such row)."""
        i = int(np.searchsorted(self.num_tokens, num_tokens))
        if i >= len(self.num_tokens) or self.num_tokens[i] != num_tokens:
            raise MeasurementError(f"{self.path}: no row for num_tokens {num_tokens} at TP {self.tp}")
        return float(self.block_s[i])


def read_block_timings(path: str | Path, *, max_num_tokens: int | None = None) -> dict[int, BlockTimings]:
    """``{tp: BlockTimings}`` of one Vidur ``mlp.csv`` (only the median columns and the shape are needed)."""
    path = Path(path)
    try:
        df = pl.read_csv(path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise MeasurementError(f"{path}: not a readable CSV: {exc}") from None
    need = [f"time_stats.{op}.median" for op in BLOCK_OPS] + list(SHAPE_COLUMNS)
    for col in need:
        if col not in df.columns:
            raise MeasurementError(f"{path}: missing column {col!r}")
    if max_num_tokens is not None:
        df = df.filter(pl.col("num_tokens") <= max_num_tokens)
    if df.is_empty():
        raise MeasurementError(f"{path}: no rows")
    total_ms = sum(pl.col(f"time_stats.{op}.median") * k for op, k in BLOCK_OPS.items())
    agg = (df.group_by("num_tensor_parallel_workers", "num_tokens")
           .agg((total_ms * 1e-3).mean().alias("block_s"), *(pl.col(c).first() for c in SHAPE_COLUMNS[:4]))
           .sort("num_tensor_parallel_workers", "num_tokens"))
    out = {}
    for (tp,), part in agg.group_by("num_tensor_parallel_workers", maintain_order=True):
        row = part.row(0, named=True)
        if row["n_embd"] % row["n_head"]:
            raise MeasurementError(f"{path}: n_embd {row['n_embd']} is not a multiple of n_head {row['n_head']}")
        out[int(tp)] = BlockTimings(
            path=str(path), tp=int(tp), hidden_size=int(row["n_embd"]),
            intermediate_size=int(row["n_expanded_embd"]), num_heads=int(row["n_head"]),
            num_kv_heads=int(row["n_kv_head"]), num_tokens=part["num_tokens"].to_numpy().astype(np.int64),
            block_s=part["block_s"].to_numpy().astype(np.float64))
    return out
