"""Where a simulator's error sits: simulated against live latency, per request, binned by prompt length and by
the batch a request ran in.

The input is a fidelity run's ``records.parquet`` (columns ``source``: ``sim`` or ``live-K``, ``router``, and with
``--calibrate-on`` also ``workload``). Each live repeat is joined to the simulated run of the same requests on
``request_id``; a bin's error is (sum of simulated latency - sum of live latency) / sum of live latency, so a bin's
figure is the error of its mean. The batch size of a request is how many requests its instance had running,
itself included, when it was dispatched, counted on the live repeat (the quantity the step model's decode terms
depend on); the prompt length is what the prefill term depends on. A term of the step model that does not carry
from one workload to another shows as a trend across one of the two binnings.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import polars as pl

from ..metrics.summary import derive

PROMPT_EDGES = (0, 128, 256, 512, 1024, 2048)
BATCH_EDGES = (1, 2, 3, 5, 9, 17)


def _labels(edges: Sequence[int]) -> list[str]:
    out = []
    for i, lo in enumerate(edges):
        hi = edges[i + 1] - 1 if i + 1 < len(edges) else None
        out.append(f"{lo}+" if hi is None else (str(lo) if hi == lo else f"{lo}-{hi}"))
    return out


def running_at_dispatch(instance: np.ndarray, dispatch_s: np.ndarray, finish_s: np.ndarray) -> np.ndarray:
    """Per request, the requests on its instance dispatched at or before it and not finished when it was
    dispatched (itself included)."""
    same = instance[:, None] == instance[None, :]
    started = dispatch_s[None, :] <= dispatch_s[:, None]
    running = finish_s[None, :] > dispatch_s[:, None]
    return (same & started & running).sum(axis=1)


def paired(records: pl.DataFrame) -> pl.DataFrame:
    """One row per (workload, router, live repeat, request): live and simulated E2E and TTFT, prompt tokens, and
    the live batch size at dispatch."""
    df = derive(records).filter(pl.col("error").is_null() & pl.col("finish_s").is_not_null()).collect()
    if "workload" not in df.columns:
        df = df.with_columns(pl.lit("").alias("workload"))
    keys = ["workload", "router"]
    sim = df.filter(pl.col("source") == "sim").select(*keys, "request_id", pl.col("e2e_s").alias("sim_e2e_s"),
                                                        pl.col("ttft_s").alias("sim_ttft_s"))
    frames = []
    live = df.filter(pl.col("source").str.starts_with("live-"))
    for (_w, _r, _s), part in live.group_by(["workload", "router", "source"], maintain_order=True):
        batch = running_at_dispatch(part["instance"].to_numpy(), part["dispatch_s"].to_numpy(),
                                    part["finish_s"].to_numpy())
        frames.append(part.select(*keys, "source", "request_id", "prompt_tokens", "output_tokens",
                                  pl.col("e2e_s").alias("live_e2e_s"), pl.col("ttft_s").alias("live_ttft_s"))
                      .with_columns(pl.Series("batch_size", batch)))
    if not frames:
        return pl.DataFrame()
    return pl.concat(frames).join(sim, on=[*keys, "request_id"])


def binned(pairs: pl.DataFrame, by: str, edges: Sequence[int]) -> pl.DataFrame:
    """Per (workload, router, bin of ``by``): requests, live and simulated mean E2E and TTFT, and the error of
    each simulated mean (percent)."""
    labels = _labels(edges)
    idx = np.searchsorted(np.asarray(edges), pairs[by].to_numpy(), side="right") - 1
    df = pairs.with_columns(pl.Series("bin", [labels[max(i, 0)] for i in idx]),
                            pl.Series("bin_order", np.maximum(idx, 0)))
    return (df.group_by("workload", "router", "bin", "bin_order")
            .agg(pl.len().alias("requests"), pl.col("live_e2e_s").mean(), pl.col("sim_e2e_s").mean(),
                 pl.col("live_ttft_s").mean(), pl.col("sim_ttft_s").mean())
            .with_columns(e2e_error_pct=100.0 * (pl.col("sim_e2e_s") - pl.col("live_e2e_s")) / pl.col("live_e2e_s"),
                          ttft_error_pct=100.0 * (pl.col("sim_ttft_s") - pl.col("live_ttft_s"))
                          / pl.col("live_ttft_s"))
            .sort("workload", "router", "bin_order").drop("bin_order").rename({"bin": by}))


def residual_tables(records: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """``{"prompt_tokens": ..., "batch_size": ...}``: the binned errors of :func:`binned` (empty frames when the
    records have no live rows)."""
    pairs = paired(records)
    if pairs.is_empty():
        return {"prompt_tokens": pl.DataFrame(), "batch_size": pl.DataFrame()}
    return {"prompt_tokens": binned(pairs, "prompt_tokens", PROMPT_EDGES),
            "batch_size": binned(pairs, "batch_size", BATCH_EDGES)}
