"""Writing a run directory: ``RunDir`` (``start`` → ``add`` per unit → ``finish``), the one writer.

``RunDir`` is what ``lbbench.experiment.runner`` writes a run through. A unit's requests may come as a frame in
memory (simulated) or a lazy scan of its streamed records (live, ``lbbench.rundir.records``): ``finish``
streams them all, in unit order, into ``requests.parquet`` and computes the summary from that file, reading
only the columns it needs. ``run.toml``'s ``[[units]]`` list each unit written, in the tables' row order: its
label, whether it completed and its rows in each table — what ``lbbench.experiment.resume`` reads to skip the
complete ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import polars as pl

from ..fleet import Fleet
from ..metrics.reference import with_reference
from ..metrics.summary import Slo, summarize
from ..profiles import Profile
from .layout import DECISIONS_FILE, PARTIAL_DIR, REQUESTS_FILE, SUMMARY_FILE, TIMELINE_FILE
from .runtoml import RunSettings, now_utc, write_run_toml


def write_tables(out_dir: Path, requests: pl.DataFrame, timeline: pl.DataFrame | None,
                 summary: pl.DataFrame) -> None:
    """``requests.parquet``, ``summary.parquet`` and (when there is one) ``timeline.parquet``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    requests.write_parquet(out_dir / REQUESTS_FILE)
    if timeline is not None:
        timeline.write_parquet(out_dir / TIMELINE_FILE)
    summary.write_parquet(out_dir / SUMMARY_FILE)


def frame_height(frame: pl.DataFrame | pl.LazyFrame) -> int:
    """Rows of a frame; a lazy one is counted by a scan."""
    if isinstance(frame, pl.DataFrame):
        return frame.height
    return int(frame.select(pl.len()).collect().item())


def write_requests(path: Path, frames: Sequence[pl.DataFrame | pl.LazyFrame]) -> None:
    """``frames`` one after the other (columns matched by name, types widened where they differ) into the Parquet
    file ``path``, streamed: lazy frames are read as they are written. The file is replaced whole (written
    beside it, then renamed), so a reader — or a frame read from the old file — never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    if frames:
        pl.concat([f.lazy() for f in frames], how="diagonal_relaxed").sink_parquet(tmp)
    else:
        pl.DataFrame().write_parquet(tmp)
    tmp.replace(path)


def summarize_requests(requests: pl.LazyFrame, by: Sequence[str], slo: Any = None) -> pl.DataFrame:
    """The summary of a run's request rows, with the reference columns against the strongest baseline (empty
    when there are no rows)."""
    if not frame_height(requests):
        return pl.DataFrame()
    return with_reference(summarize(requests, by=by, slo=slo), requests, by, slo)


class RunDir:
    """One run directory being written: ``start``, ``add`` each unit's frames, ``finish``."""

    def __init__(self, path: Path | str, cfg: RunSettings, profile: Profile, run_id: str, fleet: Fleet | None = None):
        self.path = Path(path)
        self.cfg = cfg
        self.profile = profile
        self.run_id = run_id
        self.fleet = fleet
        #: each unit's request rows, in memory (simulated) or a lazy scan of its streamed records (live)
        self.frames: list[pl.DataFrame | pl.LazyFrame] = []
        self.timelines: list[pl.DataFrame] = []
        self.decisions: list[pl.DataFrame] = []
        #: one entry per unit added with its label: label, complete, its rows per table (``run.toml [[units]]``)
        self.units: list[dict[str, Any]] = []
        #: keys ``note`` recorded, kept in every later ``run.toml``
        self.extra: dict[str, Any] = {}
        #: when ``start`` was called (``run.toml``'s ``created``, kept by every later write)
        self.created: str | None = None

    def start(self) -> None:
        self.created = now_utc()
        self.path.mkdir(parents=True, exist_ok=True)
        write_run_toml(self.path, self.cfg, self.profile, self.run_id, complete=False, fleet=self.fleet,
                       created=self.created)

    def note(self, **extra: Any) -> None:
        """Record ``extra`` in ``run.toml`` now, while the run is still incomplete (e.g. the cores launched
        servers were given, known before the first record); ``finish`` keeps it."""
        self.extra = {**self.extra, **extra}
        write_run_toml(self.path, self.cfg, self.profile, self.run_id, complete=False, extra=self.extra,
                       fleet=self.fleet, created=self.created)

    def partial_dir(self, label: str) -> Path:
        """Where a live unit appends its records as they complete."""
        return self.path / PARTIAL_DIR / label

    def add(self, requests: pl.DataFrame | pl.LazyFrame | None, timeline: pl.DataFrame | None,
            decisions: pl.DataFrame | None = None, unit: str | None = None, complete: bool = True) -> None:
        """One unit's frames, in unit order; ``unit`` (its label) lists it in ``run.toml``'s ``[[units]]``."""
        if unit is not None:
            self.units.append({"label": unit, "complete": complete,
                               "requests": 0 if requests is None else frame_height(requests),
                               "timeline": 0 if timeline is None else timeline.height,
                               "decisions": 0 if decisions is None else decisions.height})
        if requests is not None:
            self.frames.append(requests)
        if timeline is not None and timeline.height:
            self.timelines.append(timeline)
        if decisions is not None:
            self.decisions.append(decisions)

    def finish(self, complete: bool, extra: dict[str, Any] | None = None) -> pl.DataFrame:
        """Write the tables and the final ``run.toml``; returns the summary."""
        slo = Slo(**self.cfg.slo) if self.cfg.slo else None
        write_requests(self.path / REQUESTS_FILE, self.frames)
        summary = summarize_requests(pl.scan_parquet(self.path / REQUESTS_FILE), self.cfg.group_keys(), slo)
        if self.timelines:
            pl.concat(self.timelines, how="diagonal_relaxed").write_parquet(self.path / TIMELINE_FILE)
        summary.write_parquet(self.path / SUMMARY_FILE)
        if self.decisions:
            pl.concat(self.decisions, how="diagonal_relaxed").write_parquet(self.path / DECISIONS_FILE)
        write_run_toml(self.path, self.cfg, self.profile, self.run_id, complete=complete,
                       extra={"runs_completed": len(self.frames), **self.extra, **(extra or {}),
                              **({"units": self.units} if self.units else {})},
                       fleet=self.fleet, created=self.created)
        return summary
