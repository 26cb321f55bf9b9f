"""Reading the measured-runs table for the validation commands (rows in ``../shared/gpu-measurements/SCHEMA.md``)."""

from __future__ import annotations

import csv
from pathlib import Path

from ..errors import InputError

#: the columns every row needs for a simulation to be attempted
REQUIRED = ("id", "stage", "model", "gpu", "tp", "arrival", "rate_rps", "output_tokens")


class MeasuredFileError(InputError):
    """A measured-runs file that cannot be read (the message names the file, and the row and column)."""


def read_rows(path: str | Path) -> list[dict[str, str]]:
    p = Path(path)
    if not p.is_file():
        raise MeasuredFileError(f"{p}: no such file")
    try:
        with p.open(newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise MeasuredFileError(f"{p}: missing required column {missing[0]!r}")
            rows = []
            for i, row in enumerate(reader, start=2):
                if None in row:
                    raise MeasuredFileError(f"{p}: line {i}: more cells than the header has columns")
                rows.append(row)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise MeasuredFileError(f"{p}: not a readable CSV: {exc}") from None
    if not rows:
        raise MeasuredFileError(f"{p}: no rows")
    return rows
