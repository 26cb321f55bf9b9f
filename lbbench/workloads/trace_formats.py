"""Trace formats: which file columns mean arrival, prompt and output.

Every supported format is a ``TraceMapping`` from the canonical fields to the
file's own column names plus the unit of its arrival column:

============ ============================== ======================================
format       detected by these columns      notes
============ ============================== ======================================
canonical    arrival_s, prompt_tokens,      seconds; optional task, prefix_hashes,
             output_tokens                  failed
azure        TIMESTAMP, ContextTokens,      Azure LLM inference 2023/2024: wall
             GeneratedTokens                clock strings, up to 9 fractional digits
burstgpt     Timestamp, Request tokens,     seconds; task = Model (map
             Response tokens                ``task=Log Type`` for the log type);
                                            zero-response rows are failures
mooncake     timestamp, input_length,       milliseconds; hash_ids are 512-token
             output_length                  prefix blocks
mapped       (given by ``--mapping``)       any CSV / JSONL / Parquet
============ ============================== ======================================

A user mapping (``arrival=COL,prompt=COL,output=COL[,task=COL][,hashes=COL]
[,failed=COL][,unit=s|ms|us|ns|datetime]``) overrides the detected format's
fields, so ``task=Log Type`` on a BurstGPT file takes the task from the log
type, and a file no format recognises is read with the mapping alone.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .errors import TraceError

TIME_UNITS: dict[str, float | None] = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "datetime": None}
MAPPING_KEYS = ("arrival", "prompt", "output", "task", "hashes", "failed", "unit")


@dataclass(frozen=True)
class TraceMapping:
    """File column names for the canonical fields (``None``: the file has none)."""

    arrival: str | None = None
    prompt: str | None = None
    output: str | None = None
    task: str | None = None
    hashes: str | None = None
    failed: str | None = None
    unit: str | None = None  # one of TIME_UNITS; None = seconds
    block_tokens: int | None = None  # tokens per prefix-hash block
    optional: tuple[str, ...] = ()  # fields used only when the file has the column

    def merged(self, other: "TraceMapping | None") -> "TraceMapping":
        """``self`` with every field ``other`` sets replaced (a user override)."""
        if other is None:
            return self
        kw = {f.name: getattr(other, f.name) for f in fields(other)
              if f.name not in ("optional", "block_tokens") and getattr(other, f.name) is not None}
        given = set(kw)
        return replace(self, **kw, optional=tuple(o for o in self.optional if o not in given))


FORMATS: dict[str, TraceMapping] = {
    "canonical": TraceMapping("arrival_s", "prompt_tokens", "output_tokens", "task", "prefix_hashes",
                              "failed", "s", optional=("task", "hashes", "failed")),
    "azure": TraceMapping("TIMESTAMP", "ContextTokens", "GeneratedTokens", unit="datetime"),
    "burstgpt": TraceMapping("Timestamp", "Request tokens", "Response tokens", "Model", unit="s",
                             optional=("task",)),
    "mooncake": TraceMapping("timestamp", "input_length", "output_length", hashes="hash_ids", unit="ms",
                             block_tokens=512, optional=("hashes",)),
}
FORMAT_NAMES: tuple[str, ...] = (*FORMATS, "mapped")


def parse_mapping(text: str) -> TraceMapping:
    """Parse ``arrival=COL,prompt=COL,output=COL[,task=COL][,unit=ms]...``."""
    kw: dict[str, str] = {}
    for part in str(text).split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise TraceError(f"mapping: expected KEY=COLUMN, got {part.strip()!r}")
        if key not in MAPPING_KEYS:
            raise TraceError(f"mapping: unknown key {key!r} (keys: {', '.join(MAPPING_KEYS)})")
        if key in kw:
            raise TraceError(f"mapping: {key} given twice")
        kw[key] = value
    if "unit" in kw and kw["unit"] not in TIME_UNITS:
        raise TraceError(f"mapping: unit must be one of {', '.join(TIME_UNITS)}, got {kw['unit']!r}")
    if not kw:
        raise TraceError("mapping: empty")
    return TraceMapping(**kw)


def sniff_kind(path: Path) -> str:
    """``parquet``, ``jsonl`` or ``csv`` from the file's first bytes."""
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        return "jsonl"
    return "csv"


def first_record_columns(path: Path, kind: str) -> list[str]:
    """Column names from the CSV header or the first JSON line."""
    with open(path, "r", encoding="utf-8-sig", errors="replace") as fh:
        for line in fh:
            if line.strip():
                break
        else:
            raise TraceError(f"{path}: the file is empty")
    if kind == "jsonl":
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise TraceError(f"{path}: row 1: not valid JSON") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{path}: row 1: expected a JSON object per line")
        return list(obj)
    return [c.strip() for c in next(csv.reader([line]))]


def detect_format(columns: list[str]) -> str | None:
    cols = set(columns)
    for name, m in FORMATS.items():
        if {m.arrival, m.prompt, m.output} <= cols:
            return name
    return None


def resolve_mapping(path: Path, columns: list[str], fmt: str | None,
                    mapping: TraceMapping | None) -> tuple[str, TraceMapping]:
    """The format name and the full mapping to read ``path`` with."""
    if fmt is not None and fmt not in FORMAT_NAMES:
        raise TraceError(f"trace_format: unknown format {fmt!r} (choose from {', '.join(FORMAT_NAMES)})")
    if fmt == "mapped" and mapping is None:
        raise TraceError("trace_format mapped needs a mapping arrival=COL,prompt=COL,output=COL")
    name = fmt if fmt is not None else detect_format(columns)
    if name is None and mapping is None:
        shown = ", ".join(columns[:12]) + (", ..." if len(columns) > 12 else "")
        raise TraceError(f"{path}: unknown trace format (columns: {shown}); give a mapping "
                         "arrival=COL,prompt=COL,output=COL[,unit=ms]")
    base = FORMATS.get(name or "mapped", TraceMapping())
    full = base.merged(mapping)
    if mapping is not None and name is None:
        name = "mapped"
    for key in ("arrival", "prompt", "output"):
        if getattr(full, key) is None:
            raise TraceError(f"mapping: {key}=COLUMN is required for {path}")
    present = set(columns)
    for key in ("arrival", "prompt", "output", "task", "hashes", "failed"):
        col = getattr(full, key)
        if col is not None and col not in present:
            if key in full.optional:
                full = replace(full, **{key: None})
                continue
            shown = ", ".join(columns[:12]) + (", ..." if len(columns) > 12 else "")
            raise TraceError(f"{path}: no column {col!r} for {key} (columns: {shown})")
    return name or "mapped", full
