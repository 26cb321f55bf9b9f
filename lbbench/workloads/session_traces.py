"""Traces with conversations: Alibaba Bailian / Qwen-style records.

One JSON line (or CSV row) per request with ``chat_id``, ``parent_chat_id``
(-1, or an id not in the file, for a conversation's first request),
``timestamp`` (seconds), ``input_length``, ``output_length``, optional
``turn`` and ``hash_ids`` (prefix-block hashes of ``block_tokens`` tokens, 16
in the published traces). A request's session is the first request of its
parent chain; its turn is the ``turn`` column, else its depth in the chain.

Replayed closed loop: a later turn is sent at its recorded time, or when the
previous turn has finished if that is later (``think_s = 0``). ``rate`` rescales
the recorded times as for any trace; ``max_prompt_tokens`` filters longer
prompts out or truncates them (and their hashes).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

from ..core import Request
from .errors import TraceError
from .trace_formats import first_record_columns, sniff_kind

REQUIRED = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length")
#: tokens per hash in the published Bailian traces
BAILIAN_BLOCK_TOKENS = 16


def is_session_trace(path: str | Path) -> bool:
    """Whether ``path`` (JSONL or CSV) has the columns of a conversation trace."""
    p = Path(path)
    try:
        kind = sniff_kind(p)
        return kind != "parquet" and {"chat_id", "parent_chat_id"} <= set(first_record_columns(p, kind))
    except (OSError, TraceError):
        return False


def _read(p: Path) -> pl.DataFrame:
    kind = sniff_kind(p)
    try:
        df = pl.read_ndjson(p) if kind == "jsonl" else pl.read_csv(p)
    except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
        raise TraceError(f"{p}: cannot read as {kind}: {str(exc).splitlines()[0]}") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise TraceError(f"{p}: missing column(s) {', '.join(missing)} (a conversation trace needs "
                         f"{', '.join(REQUIRED)})")
    for c in ("timestamp", "input_length", "output_length"):
        bad = df.with_row_index("_row").filter(pl.col(c).cast(pl.Float64, strict=False).is_null()
                                               | (pl.col(c).cast(pl.Float64, strict=False) < 0))
        if bad.height:
            raise TraceError(f"{p}: row {bad['_row'][0] + 1}: {c} must be a number >= 0 "
                             f"({bad[c][0]!r})")
    return df


def load_session_trace(path: str | Path, rate: float | None = None, requests: int | None = None,
                       max_prompt_tokens: int | None = None, prompt_overflow: str = "filter",
                       block_tokens: int = BAILIAN_BLOCK_TOKENS, **other: Any) -> list[Request]:
    """Requests of a conversation trace, in arrival order with ids ``0..n-1``."""
    p = Path(path)
    unsupported = [k for k, v in other.items() if v not in (None, False, "filter")]
    if unsupported:
        flags = ", ".join("--" + k.replace("_", "-") for k in unsupported)
        raise TraceError(f"{p}: {flags}: not supported for conversation traces (chat_id/parent_chat_id)")
    df = _read(p).sort("timestamp", maintain_order=True)
    if max_prompt_tokens is not None and prompt_overflow == "filter":
        df = df.filter(pl.col("input_length") <= max_prompt_tokens)
    if requests is not None:
        df = df.head(requests)
    if not df.height:
        raise TraceError(f"{p}: no requests left to replay")
    chats = df.get_column("chat_id").to_list()
    parents = df.get_column("parent_chat_id").to_list()
    turns_col = df.get_column("turn").to_list() if "turn" in df.columns else None
    hashes_col = df.get_column("hash_ids").to_list() if "hash_ids" in df.columns else None
    times = [float(t) for t in df.get_column("timestamp").to_list()]
    t0 = times[0]
    scale = 1.0
    if rate is not None and len(times) > 1 and times[-1] > t0:
        scale = (len(times) - 1) / (times[-1] - t0) / rate
    parent_of = dict(zip(chats, parents))
    ids: dict[Any, int] = {}  # chat id -> session number
    out = []
    for i, (chat, t, pr, o) in enumerate(zip(chats, times, df.get_column("input_length").to_list(),
                                               df.get_column("output_length").to_list())):
        root, depth, seen = chat, 0, set()
        while parent_of.get(root, -1) in parent_of and root not in seen:  # parent in the file: walk up
            seen.add(root)
            root = parent_of[root]
            depth += 1
        sid = ids.setdefault(root, len(ids))
        prompt = int(pr)
        h = tuple(int(x) for x in hashes_col[i]) if hashes_col is not None and hashes_col[i] else None
        if max_prompt_tokens is not None and prompt > max_prompt_tokens:  # truncate
            prompt = max_prompt_tokens
            if h is not None:
                h = h[:math.ceil(prompt / block_tokens)]
        turn = int(turns_col[i]) if turns_col is not None and turns_col[i] is not None else depth
        out.append(Request(request_id=i, arrival_s=(t - t0) * scale, prompt_tokens=prompt,
                           output_tokens=max(1, int(o)), prefix_hashes=h,
                           prefix_block_tokens=block_tokens if h is not None else None,
                           session_id=sid, turn=turn))
    return out
