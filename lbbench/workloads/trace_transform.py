"""Transforms applied to a canonical trace before it is replayed.

Applied in this order, each optional:

1. drop failed rows (default; ``drop_failed=False`` keeps them);
2. ``window=(start_s, end_s)``: keep rows with ``start_s <= arrival_s < end_s``
   on the trace's own time axis (the first row of the file at 0);
3. ``max_prompt_tokens`` with ``prompt_overflow``: ``filter`` drops longer
   prompts, ``truncate`` cuts them to the limit (prefix hashes are cut to the
   blocks that remain);
4. ``requests=N``: the first N rows that are left;
5. re-zero: the first remaining row arrives at 0;
6. ``time_scale``: multiply every arrival time by it (2 = half the rate,
   0.5 = twice the rate);
7. ``rate``: rescale times so the mean rate — one over the mean gap between
   consecutive arrivals, ``(rows - 1) / span_s`` — equals ``rate`` requests per
   second. ``time_scale`` and ``rate`` both set the speed; give one.

So ``requests=200, rate=10`` means the first 200 requests, replayed at 10 req/s.
"""

from __future__ import annotations

import math

import polars as pl

from .errors import TraceError
from .trace_frame import TraceFrame

PROMPT_OVERFLOW_MODES = ("filter", "truncate")


def parse_window(text: str) -> tuple[float, float]:
    """``"START:END"`` (seconds; either side may be empty) -> ``(start_s, end_s)``."""
    start_text, sep, end_text = str(text).partition(":")
    if not sep:
        raise TraceError(f"window: expected START:END in seconds, got {text!r}")
    try:
        start = float(start_text) if start_text.strip() else 0.0
        end = float(end_text) if end_text.strip() else math.inf
    except ValueError:
        raise TraceError(f"window: expected START:END in seconds, got {text!r}") from None
    _check_window((start, end))
    return start, end


def _check_window(window: tuple[float, float]) -> None:
    start, end = window
    if math.isnan(start) or math.isnan(end) or start < 0 or not end > start:
        raise TraceError(f"window: need 0 <= START < END, got {start}:{end}")


def transform_trace(tf: TraceFrame, *, time_scale: float | None = None, rate: float | None = None,
                    window: tuple[float, float] | None = None, max_prompt_tokens: int | None = None,
                    prompt_overflow: str = "filter", requests: int | None = None,
                    drop_failed: bool = True) -> TraceFrame:
    """Apply the transforms (see the module docstring) and return a new ``TraceFrame``."""
    if time_scale is not None and rate is not None:
        raise TraceError("time_scale: both it and the rate set the replay speed; give only one")
    if time_scale is not None and not (math.isfinite(time_scale) and time_scale > 0):
        raise TraceError(f"time_scale: must be > 0, got {time_scale}")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise TraceError(f"rate_per_s: must be > 0 requests per second, got {rate}")
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise TraceError(f"max_prompt_tokens: must be >= 1, got {max_prompt_tokens}")
    if prompt_overflow not in PROMPT_OVERFLOW_MODES:
        raise TraceError(f"prompt_overflow: must be filter or truncate, got {prompt_overflow!r}")
    if requests is not None and requests < 1:
        raise TraceError(f"requests: must be >= 1, got {requests}")

    df = tf.frame
    if drop_failed:
        df = df.filter(~pl.col("failed"))
    if window is not None:
        _check_window(window)
        df = df.filter((pl.col("arrival_s") >= window[0]) & (pl.col("arrival_s") < window[1]))
    if max_prompt_tokens is not None:
        if prompt_overflow == "filter":
            df = df.filter(pl.col("prompt_tokens") <= max_prompt_tokens)
        else:
            df = _truncate_prompts(df, max_prompt_tokens, tf.block_tokens)
    if requests is not None:
        df = df.head(requests)
    if df.height:
        df = df.with_columns(pl.col("arrival_s") - pl.col("arrival_s").min())
    if time_scale is not None:
        df = df.with_columns(pl.col("arrival_s") * time_scale)
    if rate is not None and df.height > 1:
        span_s = float(df.get_column("arrival_s").max())
        factor = (df.height - 1) / span_s / rate if span_s > 0 else math.inf
        if not math.isfinite(factor):
            raise TraceError(f"{tf.path}: every request arrives at the same time; a rate cannot rescale it")
        df = df.with_columns(pl.col("arrival_s") * factor)
    return tf.with_frame(df)


def _truncate_prompts(df: pl.DataFrame, max_prompt_tokens: int, block_tokens: int | None) -> pl.DataFrame:
    over = pl.col("prompt_tokens") > max_prompt_tokens
    exprs = [pl.when(over).then(max_prompt_tokens).otherwise(pl.col("prompt_tokens")).alias("prompt_tokens")]
    if block_tokens:
        keep = -(-max_prompt_tokens // block_tokens)
        exprs.append(pl.when(over).then(pl.col("prefix_hashes").list.head(keep))
                     .otherwise(pl.col("prefix_hashes")).alias("prefix_hashes"))
    return df.with_columns(exprs)
