"""The raw row every corpus reader produces, the corpus error type and the
JSON Lines reader they share (line numbers kept for error messages)."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import InputError


class DataError(InputError):
    """A corpus file is missing or malformed (message names the file and row)."""


@dataclass
class Raw:
    """One row before token counting: the prompt, labels, and either the
    response text or its length in tokens."""

    prompt: str
    task: str | None
    model: str | None
    output_tokens: int | None = None
    response: str | None = None
    prompt_tokens: int | None = None
    source: str = ""


def read_jsonl_numbered(path: Path) -> list[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line (``.gz`` read transparently)."""
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{i}: not valid JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{i}: expected a JSON object")
            rows.append((i, obj))
    return rows


def read_jsonl(path: Path) -> list[dict]:
    return [obj for _, obj in read_jsonl_numbered(path)]


def opt_str(x: Any) -> str | None:
    return None if x is None or x == "" else str(x)
