"""Reading run directories: one or many, lazily, and the tables of one.

A run directory (``lbbench.rundir``) holds ``requests.parquet``, ``run.toml`` and, optionally,
``timeline.parquet`` (older live runs: the scraped ``metrics.parquet``), ``summary.parquet`` and
``decisions.parquet``. ``load_runs`` accepts run directories, directories that contain run directories (one
``requests.parquet`` per sub-directory, any depth), or ``requests.parquet`` files, and returns one lazy frame over
all of them with a ``run`` column naming where each row came from. ``read_requests``, ``read_summary`` and
``read_unit_tables`` read one run's tables; ``read_decisions`` the decisions of many.

Which settings a report groups by is decided from the data: the router, plus every
run-level setting (``SETTING_COLUMNS``) that takes more than one value across the loaded
runs, plus ``run`` itself when two runs would otherwise mix rows of the same seed.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import polars as pl

from ..errors import InputError
from .layout import (DECISIONS_FILE, METRICS_FILE, REQUESTS_FILE, RUN_TOML, SETTING_COLUMNS, SUMMARY_FILE,
                     TIMELINE_FILE)
from .runtoml import read_run_toml


class RunDirError(InputError):
    """A path given as a run cannot be read; the message names the path."""


@dataclass
class RunInfo:
    """One run directory: where it is, its label and its ``run.toml`` (may be empty)."""

    label: str
    path: Path
    requests_path: Path
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return bool(self.config.get("complete", True))

    @property
    def timeline_path(self) -> Path | None:
        """``timeline.parquet``, else a live run's scraped ``metrics.parquet``."""
        for name in (TIMELINE_FILE, METRICS_FILE):
            p = self.path / name
            if p.is_file():
                return p
        return None

    def timeline(self) -> pl.LazyFrame | None:
        """The run's per-instance samples, scanned lazily (None when it has none)."""
        path = self.timeline_path
        return None if path is None else pl.scan_parquet(path)


@dataclass
class Runs:
    """Loaded runs: the lazy request rows (with ``run``) and per-run information."""

    infos: list[RunInfo]
    requests: pl.LazyFrame

    def group_keys(self) -> list[str]:
        """``router`` plus the settings that differ between rows (see module docstring)."""
        return group_keys(self.requests)

    def timeline(self) -> pl.LazyFrame | None:
        """The runs' ``timeline.parquet`` rows (with ``run``), or None when no run has one."""
        frames = [tl.with_columns(run=pl.lit(i.label)) for i in self.infos if (tl := i.timeline()) is not None]
        if not frames:
            return None
        return pl.concat(frames, how="diagonal_relaxed")


def _find(path: Path) -> list[Path]:
    if path.is_file():
        if path.suffix != ".parquet":
            raise RunDirError(f"{path}: not a run directory or a {REQUESTS_FILE} file")
        return [path]
    if not path.exists():
        raise RunDirError(f"{path}: no such run directory")
    direct = path / REQUESTS_FILE
    if direct.is_file():
        return [direct]
    found = sorted(path.rglob(REQUESTS_FILE))
    if not found:
        raise RunDirError(f"{path}: no {REQUESTS_FILE} here or below (is it a run directory?)")
    return found


def _labels(dirs: list[Path]) -> list[str]:
    """Shortest distinct labels: the directory name, or more of the path when names clash."""
    parts = [d.resolve().parts for d in dirs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(d) for d in dirs]


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return read_run_toml(path)
    except tomllib.TOMLDecodeError as exc:
        raise RunDirError(f"{path / RUN_TOML}: not valid TOML: {exc}") from None


def load_runs(paths: Sequence[str | Path]) -> Runs:
    """Lazy scan of every run under ``paths`` (see module docstring)."""
    if not paths:
        raise RunDirError("no run directories given")
    files: list[Path] = []
    for p in paths:
        for f in _find(Path(p)):
            if f.resolve() not in {x.resolve() for x in files}:
                files.append(f)
    dirs = [f.parent for f in files]
    infos = [RunInfo(label, d, f, _read_toml(d)) for label, d, f in zip(_labels(dirs), dirs, files)]
    frames = []
    for info in infos:
        try:
            schema = pl.read_parquet_schema(info.requests_path)
        except Exception as exc:  # polars raises several error types for bad files
            raise RunDirError(f"{info.requests_path}: not a readable parquet file ({exc})") from None
        missing = [c for c in ("router", "seed", "arrival_s", "finish_s") if c not in schema]
        if missing:
            raise RunDirError(f"{info.requests_path}: missing column(s) {', '.join(missing)}")
        frames.append(pl.scan_parquet(info.requests_path).with_columns(run=pl.lit(info.label)))
    return Runs(infos, pl.concat(frames, how="diagonal_relaxed"))


def varying_settings(lf: pl.LazyFrame, candidates: Sequence[str] = SETTING_COLUMNS) -> list[str]:
    """Setting columns present in ``lf`` that take more than one value (nulls count)."""
    present = [c for c in candidates if c in lf.collect_schema()]
    if not present:
        return []
    counts = lf.select([pl.col(c).n_unique() for c in present]).collect().row(0)
    return [c for c, n in zip(present, counts) if n > 1]


def group_keys(lf: pl.LazyFrame) -> list[str]:
    keys = ["router", *varying_settings(lf)]
    if "run" in lf.collect_schema():
        clash = (lf.group_by([*keys, "seed"]).agg(pl.col("run").n_unique().alias("n"))
                 .select((pl.col("n") > 1).any()).collect().item())
        if clash:
            keys.append("run")
    return keys


def settings_of(lf: pl.LazyFrame, candidates: Sequence[str] = SETTING_COLUMNS) -> dict[str, list]:
    """Distinct values of each setting column present (sorted, nulls last)."""
    out: dict[str, list] = {}
    schema = lf.collect_schema()
    for c in candidates:
        if c in schema:
            vals = lf.select(pl.col(c).unique()).collect().to_series().to_list()
            out[c] = sorted(vals, key=lambda v: (v is None, str(v)))
    return out


def read_requests(run_dir: Path | str) -> pl.DataFrame | None:
    """One run's ``requests.parquet`` (None when it has none)."""
    path = Path(run_dir) / REQUESTS_FILE
    return pl.read_parquet(path) if path.is_file() else None


def scan_requests(run_dir: Path | str) -> pl.LazyFrame | None:
    """One run's ``requests.parquet``, scanned lazily (None when it has none)."""
    path = Path(run_dir) / REQUESTS_FILE
    return pl.scan_parquet(path) if path.is_file() else None


def read_summary(run_dir: Path | str) -> pl.DataFrame:
    """One run's ``summary.parquet``; ``RunDirError`` when it has none (the run did not finish)."""
    path = Path(run_dir) / SUMMARY_FILE
    if not path.is_file():
        raise RunDirError(f"{run_dir}: no {SUMMARY_FILE} (the run did not finish)")
    return pl.read_parquet(path)


def has_decisions(run_dir: Path | str) -> bool:
    return (Path(run_dir) / DECISIONS_FILE).is_file()


def read_decisions(runs: Sequence[tuple[str, Path]]) -> pl.DataFrame | None:
    """Every ``decisions.parquet`` of ``(label, run directory)``, with a ``run`` column; None when none."""
    frames = [pl.read_parquet(p / DECISIONS_FILE).with_columns(run=pl.lit(label))
              for label, p in runs if has_decisions(p)]
    return pl.concat(frames, how="diagonal_relaxed") if frames else None


def read_unit_tables(run_dir: Path | str) -> tuple[pl.DataFrame | None, pl.DataFrame | None, pl.DataFrame | None]:
    """One run's ``requests``, ``timeline`` and ``decisions`` tables, each None when absent (what
    ``run.toml``'s ``[[units]]`` count rows of)."""
    path = Path(run_dir)
    return tuple(pl.read_parquet(path / name) if (path / name).is_file() else None  # type: ignore[return-value]
                 for name in (REQUESTS_FILE, TIMELINE_FILE, DECISIONS_FILE))
