"""Summary statistics of a canonical trace (``lbbench trace inspect``).

``rows`` counts every row of the frame and ``span_s`` / ``rate_per_s`` use all
arrivals (the mean rate is ``(rows - 1) / span_s``, one over the mean gap);
token statistics leave out failed rows, whose lengths are not real requests.
Percentiles interpolate linearly between order statistics. With prefix hashes
(Mooncake), ``prefix_blocks_repeated_share`` is the share of hash occurrences
whose id already appeared in an earlier request: an upper bound on the
prefix-cache hit ratio of an unbounded cache.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from .trace_frame import TraceFrame

_QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def _token_stats(s: pl.Series, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    empty = s.len() == 0
    out[f"{prefix}_mean"] = None if empty else float(s.mean())
    out[f"{prefix}_min"] = None if empty else int(s.min())
    for name, q in _QUANTILES:
        out[f"{prefix}_{name}"] = None if empty else float(s.quantile(q, interpolation="linear"))
    out[f"{prefix}_max"] = None if empty else int(s.max())
    return out


def inspect_trace(frame: TraceFrame | pl.DataFrame) -> dict[str, Any]:
    """A flat dict of counts, span, rate and prompt/output length statistics."""
    tf = frame if isinstance(frame, TraceFrame) else None
    df = tf.frame if tf is not None else frame
    out: dict[str, Any] = {}
    if tf is not None:
        out.update(file=tf.path, format=tf.format, skipped_rows=tf.skipped_rows)
    rows = df.height
    times = df.get_column("arrival_s")
    span_s = float(times.max() - times.min()) if rows else 0.0
    failed = int(df.get_column("failed").sum())
    out.update(rows=rows, failed_rows=failed, span_s=span_s,
               rate_per_s=(rows - 1) / span_s if rows > 1 and span_s > 0 else None)
    ok = df.filter(~pl.col("failed"))
    out.update(_token_stats(ok.get_column("prompt_tokens"), "prompt_tokens"))
    out.update(_token_stats(ok.get_column("output_tokens"), "output_tokens"))
    tasks = df.get_column("task").drop_nulls()
    if tasks.len():
        counts = tasks.value_counts(sort=True)
        out["tasks"] = {str(k): int(v) for k, v in zip(counts.get_column("task"), counts.get_column("count"))}
    hashes = df.select(pl.int_range(pl.len()).alias("_i"), "prefix_hashes").drop_nulls("prefix_hashes")
    if hashes.height:
        flat = hashes.explode("prefix_hashes").drop_nulls("prefix_hashes")
        first = flat.group_by("prefix_hashes").agg(pl.col("_i").min().alias("_first"))
        joined = flat.join(first, on="prefix_hashes")
        repeated = int((joined.get_column("_i") > joined.get_column("_first")).sum())
        out["prefix_blocks"] = flat.height
        out["prefix_blocks_repeated_share"] = repeated / flat.height if flat.height else None
        if tf is not None and tf.block_tokens:
            out["prefix_block_tokens"] = tf.block_tokens
    return out
