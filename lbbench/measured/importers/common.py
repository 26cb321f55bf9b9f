"""What every importer shares: the raw rows it returns, the user's context (``--set``), finishing into rows.

An importer is a pure function ``read(path, facts) -> Imported``: from one raw result (a file or a folder) to rows
of column values it could read or derive, plus notes (what it derived and how, what looked wrong in the source)
and problems (a stage it cannot express in the schema). Settings the raw files do not say stay absent; they are
never guessed. What the user knows and the files do not (the GPU of an inference-perf run, say) comes as
*context*, ``column=value`` pairs applied to every row (``lbbench measured import --set gpu=h100``). ``finish``
applies the context and builds each row through the schema's rules, so an imported row obeys exactly what a read
one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..schema import (BY_NAME, CellError, MeasuredError, MeasuredRow, MeasuredRowError, build_row, check_value,
                      format_cell, parse_cell)


@dataclass
class RawRow:
    """One stage as an importer read it: where from, and column -> value (absent = unknown)."""

    origin: Path
    values: dict[str, Any]


@dataclass
class Imported:
    """An importer's result (module docstring)."""

    rows: list[RawRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[MeasuredRowError] = field(default_factory=list)

    def extend(self, other: "Imported") -> None:
        self.rows += other.rows
        self.notes += other.notes
        self.problems += other.problems


def ms(seconds: float | None) -> float | None:
    """Seconds to milliseconds, to the microsecond."""
    return None if seconds is None else round(float(seconds) * 1e3, 3)


def ns_to_ms(ns: float | None) -> float | None:
    return None if ns is None else round(float(ns) / 1e6, 3)


def rounded(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def parse_context(pairs: Sequence[str]) -> dict[str, Any]:
    """``["gpu=h100", "tp=2"]`` -> ``{"gpu": "h100", "tp": 2}``, each value checked as its column's cell."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep:
            raise MeasuredError(f"--set {pair!r}: expected COLUMN=VALUE")
        if name not in BY_NAME:
            raise MeasuredError(f"--set {name}: not a column of the measured-runs schema")
        try:
            out[name] = check_value(name, parse_cell(name, text))
        except CellError as exc:
            raise MeasuredError(f"--set {name}: {exc}") from None
    return out


def finish(imported: Imported, context: Mapping[str, Any] | None = None
           ) -> tuple[list[MeasuredRow], list[MeasuredRowError], list[str]]:
    """The rows, the problems (the importer's and each row the schema refuses) and the notes of ``imported``
    with ``context`` applied (a context value replaces what the files said, with a note when it differs)."""
    context = dict(context or {})
    rows: list[MeasuredRow] = []
    problems = list(imported.problems)
    notes = list(imported.notes)
    seen: dict[tuple[Any, Any], Path] = {}
    for raw in imported.rows:
        values = dict(raw.values)
        for name, value in context.items():
            old = values.get(name)
            if old is not None and old != value:
                notes.append(f"{raw.origin} (id={values.get('id')}, stage={values.get('stage')}): --set {name}="
                             f"{format_cell(value)} replaces {format_cell(old)} read from the files")
            values[name] = value

        def error(problem: str, column: str | None = None, _v: dict = values, _o: Path = raw.origin
                  ) -> MeasuredRowError:
            if problem.startswith("empty, but required"):
                problem += f"; the files do not say it: give --set {column}=VALUE"
            return MeasuredRowError(_o, problem, id=_v.get("id"), stage=_v.get("stage"), column=column)

        try:
            row = build_row(values, error=error)
        except MeasuredRowError as exc:
            problems.append(exc)
            continue
        if row.key in seen:
            problems.append(error(f"the same id and stage as a row of {seen[row.key]}", "stage"))
            continue
        seen[row.key] = raw.origin
        rows.append(row)
    return rows, problems, notes


def first(mapping: Mapping[str, Any] | None, *keys: str) -> Any:
    """The value of the first of ``keys`` present (and not None) in ``mapping``."""
    for k in keys:
        if mapping and mapping.get(k) is not None:
            return mapping[k]
    return None


def require(path: Path, what: str, value: Any) -> Any:
    """``value``, or a ``MeasuredError`` naming ``path`` and what is missing."""
    if value is None:
        raise MeasuredError(f"{path}: {what} missing")
    return value
