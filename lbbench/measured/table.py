"""Reading and writing measured-runs files (CSV, or Parquet by the ``.parquet`` suffix): the one reader.

``read_measured(path)`` is what every consumer calls (``lbbench measured check``, ``lbbench fidelity
--measured``, calibration). It returns a ``MeasuredTable``: the rows that obey the schema
(``lbbench.measured.schema``) and, when read leniently, one ``MeasuredRowError`` per row that does not, so that
the good rows can still run while each bad one is reported. Read strictly (the default), the first problem
raises. Problems with the file as a whole — not there, not text, malformed quoting, a header without a required
column or with a misspelt one — always raise, since no row can be trusted then.

Every message is one line naming the file, the row (its 1-based data row, ``id`` and ``stage``) and the column:
``measured.csv: row 3 (id=exp-a, stage=1), column tp: 'two' is not an integer``.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import polars as pl

from .schema import (BY_NAME, COLUMN_NAMES, COLUMNS, REQUIRED, CellError, MeasuredError, MeasuredRow,
                     MeasuredRowError, build_row, close_column, format_cell, parse_cell)


@dataclass
class MeasuredTable:
    """What ``read_measured`` found: the good rows in file order, the bad ones' problems, the extra columns."""

    path: Path
    rows: list[MeasuredRow] = field(default_factory=list)
    problems: list[MeasuredRowError] = field(default_factory=list)
    extra_columns: tuple[str, ...] = ()
    #: each good row's 1-based data-row number in the file
    numbers: list[int] = field(default_factory=list)


def _header(path: Path, names: Sequence[str]) -> tuple[str, ...]:
    """The header's extra columns, after refusing an unreadable header (the message names the problem)."""
    seen: set[str] = set()
    for k, name in enumerate(names, start=1):
        if not name:
            raise MeasuredError(f"{path}: header: column {k} has no name")
        if name in seen:
            raise MeasuredError(f"{path}: header: column {name!r} appears twice")
        seen.add(name)
    for name in REQUIRED:
        if name not in seen:
            raise MeasuredError(f"{path}: header: missing required column {name!r}")
    extras = []
    for name in names:
        if name in BY_NAME:
            continue
        near = close_column(name)
        if near is not None:
            raise MeasuredError(f"{path}: header: unknown column {name!r} (did you mean {near!r}?)")
        extras.append(name)
    return tuple(extras)


def _row(path: Path, n: int, header: Sequence[str], cells: Sequence[str], seen: dict) -> MeasuredRow:
    """Data row ``n`` (1-based) as a ``MeasuredRow``; ``MeasuredRowError`` naming its first problem."""
    by_name = dict(zip(header, cells))
    ident, stage = by_name.get("id", "").strip(), by_name.get("stage", "").strip()

    def error(problem: str, column: str | None = None) -> MeasuredRowError:
        return MeasuredRowError(path, problem, row=n, id=ident, stage=stage, column=column)

    if len(cells) != len(header):
        raise error(f"{len(cells)} cells, but the header has {len(header)} columns")
    values: dict[str, Any] = {}
    extra: list[tuple[str, str]] = []
    for name, text in zip(header, cells):
        if name not in BY_NAME:
            extra.append((name, text))
            continue
        try:
            values[name] = parse_cell(name, text)
        except CellError as exc:
            raise error(str(exc), name) from None
    row = build_row(values, extra, error=error)
    if row.key in seen:
        raise error(f"duplicate of row {seen[row.key]} (the same id and stage)", "stage")
    seen[row.key] = n
    return row


def _csv_records(path: Path) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:  # no newline translation: "\r" in a cell stays
            text = f.read()
    except UnicodeDecodeError as exc:
        raise MeasuredError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)

    def records() -> Iterator[tuple[int, list[str]]]:
        try:
            for cells in reader:
                if cells and any(c.strip() for c in cells):
                    yield reader.line_num, cells
        except csv.Error as exc:
            raise MeasuredError(f"{path}: line {reader.line_num}: malformed CSV ({exc})") from None

    it = records()
    first = next(it, None)
    if first is None:
        raise MeasuredError(f"{path}: empty file (no header row)")
    return [c.strip() for c in first[1]], it


def _parquet_records(path: Path) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    try:
        df = pl.read_parquet(path)
    except Exception as exc:  # polars raises several error types for an unreadable file
        raise MeasuredError(f"{path}: not a readable Parquet file ({exc})") from None
    header = list(df.columns)
    return header, ((k, [format_cell(v) for v in row]) for k, row in enumerate(df.iter_rows(), start=2))


def read_measured(path: str | Path, *, strict: bool = True) -> MeasuredTable:
    """The rows of a measured-runs CSV (or ``.parquet``) file; see the module docstring for ``strict``."""
    p = Path(path)
    if not p.is_file():
        raise MeasuredError(f"{p}: no such file")
    header, records = (_parquet_records if p.suffix.lower() == ".parquet" else _csv_records)(p)
    table = MeasuredTable(p, extra_columns=_header(p, header))
    seen: dict[tuple[str, int], int] = {}
    for n, (_line, cells) in enumerate(records, start=1):
        try:
            table.rows.append(_row(p, n, header, cells, seen))
            table.numbers.append(n)
        except MeasuredRowError as exc:
            if strict:
                raise
            table.problems.append(exc)
    if not table.rows and not table.problems:
        raise MeasuredError(f"{p}: no data rows")
    return table


def _extra_columns(rows: Iterable[MeasuredRow]) -> list[str]:
    out: list[str] = []
    for row in rows:
        out += [name for name, _ in row.extra if name not in out]
    return out


def write_measured(rows: Sequence[MeasuredRow], path: str | Path) -> Path:
    """Write ``rows`` in the schema's column order (extra columns after them): CSV, or Parquet for ``.parquet``."""
    p = Path(path)
    extras = _extra_columns(rows)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix.lower() == ".parquet":
        types = {str: pl.Utf8, int: pl.Int64, float: pl.Float64, bool: pl.Boolean}
        data: dict[str, list[Any]] = {c.name: [getattr(r, c.name) for r in rows] for c in COLUMNS}
        data.update({name: [dict(r.extra).get(name) for r in rows] for name in extras})
        schema = {**{c.name: types[c.kind] for c in COLUMNS}, **{name: pl.Utf8 for name in extras}}
        pl.DataFrame(data, schema=schema).write_parquet(p)
        return p
    with p.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        # csv quotes a field holding the line terminator ("\n"), not one holding a lone "\r", which a reader takes
        # for a line end: such a row is written with every field quoted
        quoted = csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_ALL)
        w.writerow([*COLUMN_NAMES, *extras])
        for r in rows:
            ex = dict(r.extra)
            cells = [*(format_cell(getattr(r, name)) for name in COLUMN_NAMES), *(ex.get(x, "") for x in extras)]
            (quoted if any("\r" in c for c in cells) else w).writerow(cells)
    return p
