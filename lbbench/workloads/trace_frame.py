"""The canonical trace frame: its column schema and ``TraceFrame`` (the frame plus where it came from).

Every trace module works on this type: ``traces`` reads files into it, ``trace_transform`` and ``trace_stats``
work on it. It imports none of them, so the reader sits above the transforms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import polars as pl

CANONICAL_SCHEMA: dict[str, Any] = {
    "arrival_s": pl.Float64, "prompt_tokens": pl.Int64, "output_tokens": pl.Int64,
    "task": pl.String, "prefix_hashes": pl.List(pl.Int64), "failed": pl.Boolean,
}


@dataclass(frozen=True)
class TraceFrame:
    """A canonical trace frame plus where it came from."""

    frame: pl.DataFrame
    path: str
    format: str
    skipped_rows: int = 0
    block_tokens: int | None = None  # tokens per prefix-hash block, when known

    def __len__(self) -> int:
        return self.frame.height

    def with_frame(self, frame: pl.DataFrame) -> "TraceFrame":
        return replace(self, frame=frame)


def empty_frame() -> pl.DataFrame:
    return pl.DataFrame(schema=CANONICAL_SCHEMA)
