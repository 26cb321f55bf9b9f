"""The run directory: the one module that writes and reads it.

A run directory holds

- ``run.toml``: the resolved ``RunConfig`` under ``[config]``, the seeds, the profile (the first instance's),
  the fleet under ``[fleet]`` (``Fleet.to_toml_dict``: its spec and one entry per profile), the git revision and
  library versions, ``complete`` (false while the run is going and after an interrupted one), ``wall_s``;
- ``requests.parquet``: one row per request, every simulated and live run alike (``records_frame``);
- ``timeline.parquet``: per-instance samples over time — simulated, or scraped from live ``/metrics``
  (older live runs wrote them to ``metrics.parquet``, which is still read);
- ``summary.parquet``: the summary with the gain against the strongest baseline;
- ``decisions.parquet`` (``--decisions``): one row per routing decision of every unit
  (``lbbench.experiment.decisions.DECISION_SCHEMA``, with the unit's columns);
- ``partial/<unit>/`` (live runs, ``lbbench.harness.record_log``): ``requests.partial.jsonl``, each record
  appended as its request ends, so an interrupted run keeps everything it measured, and the same records in
  Parquet chunks (``records-NNNNN.parquet``), which ``requests.parquet`` is written from: the client never
  holds a live run's records in memory.

``run.toml``'s ``[[units]]`` list each unit written, in the tables' row order: its label, whether it completed
and its rows in each table — what ``lbbench.experiment.resume`` reads to skip the complete ones.

``RunDir`` writes one (``start`` → ``add`` per unit → ``finish``); ``read_run_toml`` and the file names serve
``lbbench.reports.load``, which scans many. A unit's requests may come as a frame in memory (simulated) or a lazy
scan of its streamed records (live): ``finish`` streams them all, in unit order, into ``requests.parquet`` and
computes the summary from that file, reading only the columns it needs.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import subprocess
import tomllib
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import polars as pl
import tomli_w

from .. import __version__
from ..core import RECORD_FIELDS, RequestRecord
from ..fleet import Fleet
from ..profiles import Profile
from .config import RunConfig, workload_label

REQUESTS_FILE = "requests.parquet"
TIMELINE_FILE = "timeline.parquet"
#: live runs before the timeline was one file wrote scraped samples here
METRICS_FILE = "metrics.parquet"
SUMMARY_FILE = "summary.parquet"
DECISIONS_FILE = "decisions.parquet"
RUN_TOML = "run.toml"
PARTIAL_DIR = "partial"

RECORD_SCHEMA: dict[str, Any] = {
    "run_id": pl.Utf8, "router": pl.Utf8, "seed": pl.Int64, "request_id": pl.Int64, "task": pl.Utf8,
    "instance": pl.Int64, "arrival_s": pl.Float64, "dispatch_s": pl.Float64,
    "first_token_s": pl.Float64, "finish_s": pl.Float64, "prompt_tokens": pl.Int64,
    "output_tokens": pl.Int64, "generated_tokens": pl.Int64, "predicted_output_tokens": pl.Int64,
    "predicted_bucket": pl.Int64, "num_preemptions": pl.Int64, "tbt_mean_s": pl.Float64,
    "tbt_p99_s": pl.Float64, "tbt_max_s": pl.Float64, "planned_send_s": pl.Float64,
    "actual_send_s": pl.Float64, "server_prompt_tokens": pl.Int64, "server_output_tokens": pl.Int64,
    "http_status": pl.Int64, "error": pl.Utf8, "session_id": pl.Int64, "turn": pl.Int64,
    "think_s": pl.Float64, "cached_prompt_tokens": pl.Int64,
}
TIMELINE_SCHEMA: dict[str, Any] = {
    "time_s": pl.Float64, "instance": pl.Int64, "num_running": pl.Int64, "num_waiting": pl.Int64,
    "kv_usage": pl.Float64, "num_preemptions": pl.Int64, "prefix_cache_hit_rate": pl.Float64,
}


def records_frame(records: Sequence[RequestRecord], extra: dict[str, Any]) -> pl.DataFrame:
    """The ``requests.parquet`` rows of one unit's records, with the run-level columns ``extra``."""
    cols = {name: [getattr(r, name) for r in records] for name in RECORD_FIELDS}
    df = pl.DataFrame(cols, schema=RECORD_SCHEMA)
    return df.with_columns([pl.lit(v).alias(k) for k, v in extra.items()])


def timeline_frame(rows: Sequence[tuple] | pl.DataFrame, extra: dict[str, Any]) -> pl.DataFrame | None:
    """The ``timeline.parquet`` rows of one unit (tuples in ``TIMELINE_SCHEMA`` order, a missing hit rate
    allowed), with the unit's columns ``extra``; None when there are none."""
    if isinstance(rows, pl.DataFrame):
        df = rows
    else:
        if not rows:
            return None
        width = len(rows[0])
        names = list(TIMELINE_SCHEMA)[:width]
        df = pl.DataFrame(list(rows), schema={k: TIMELINE_SCHEMA[k] for k in names}, orient="row")
    if df.height == 0:
        return None
    if "prefix_cache_hit_rate" not in df.columns:
        df = df.with_columns(pl.lit(None, pl.Float64).alias("prefix_cache_hit_rate"))
    return df.with_columns([pl.lit(v, pl.Float64 if k == "rate_per_s" else None).alias(k)
                            for k, v in extra.items()])


def git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    out = {"lbbench": __version__, "python": platform.python_version()}
    for dist in ("polars", "numpy", "click", "rich", "aiohttp"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def default_out_dir(cfg: RunConfig) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{workload_label(cfg).replace(':', '-').replace('/', '-')}"


def _clean(x: Any) -> Any:
    """TOML has no null: drop None values of tables, write None list items as "default"."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items() if v is not None}
    if isinstance(x, (list, tuple)):
        return [_clean(v) if v is not None else "default" for v in x]
    return x


def write_run_toml(path: Path, cfg: RunConfig, profile: Profile, run_id: str, complete: bool,
                   extra: dict[str, Any] | None = None, fleet: Fleet | None = None) -> None:
    doc = {
        "run_id": run_id,
        "complete": complete,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision() or "unknown",
        "config": _clean(asdict(cfg)),
        "seeds": cfg.seed_list(),
        "profile": _clean({k: v for k, v in asdict(profile).items() if k != "source"}),
        "profile_source": profile.source,
        "versions": versions(),
    }
    if fleet is not None:
        doc["fleet"] = _clean(fleet.to_toml_dict())
    if extra:
        doc.update(_clean(extra))
    path.write_text(tomli_w.dumps(doc))


def read_run_toml(run_dir: Path) -> dict[str, Any]:
    """A run directory's ``run.toml`` ({} when it has none); ``tomllib.TOMLDecodeError`` when unreadable."""
    p = Path(run_dir) / RUN_TOML
    if not p.is_file():
        return {}
    return tomllib.loads(p.read_text())


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
    from ..reports.reference import with_reference
    from ..reports.summary import summarize

    if not frame_height(requests):
        return pl.DataFrame()
    return with_reference(summarize(requests, by=by, slo=slo), requests, by, slo)


class RunDir:
    """One run directory being written: ``start``, ``add`` each unit's frames, ``finish``."""

    def __init__(self, path: Path | str, cfg: RunConfig, profile: Profile, run_id: str, fleet: Fleet | None = None):
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

    def start(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_run_toml(self.path / RUN_TOML, self.cfg, self.profile, self.run_id, complete=False, fleet=self.fleet)

    def note(self, **extra: Any) -> None:
        """Record ``extra`` in ``run.toml`` now, while the run is still incomplete (e.g. the cores launched
        servers were given, known before the first record); ``finish`` keeps it."""
        self.extra = {**getattr(self, "extra", {}), **extra}
        write_run_toml(self.path / RUN_TOML, self.cfg, self.profile, self.run_id, complete=False, extra=self.extra,
                       fleet=self.fleet)

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
        from ..reports.summary import Slo

        slo = Slo(**self.cfg.slo) if self.cfg.slo else None
        write_requests(self.path / REQUESTS_FILE, self.frames)
        summary = summarize_requests(pl.scan_parquet(self.path / REQUESTS_FILE), self.cfg.group_keys(), slo)
        if self.timelines:
            pl.concat(self.timelines, how="diagonal_relaxed").write_parquet(self.path / TIMELINE_FILE)
        summary.write_parquet(self.path / SUMMARY_FILE)
        if self.decisions:
            pl.concat(self.decisions, how="diagonal_relaxed").write_parquet(self.path / DECISIONS_FILE)
        write_run_toml(self.path / RUN_TOML, self.cfg, self.profile, self.run_id, complete=complete,
                       extra={"runs_completed": len(self.frames), **getattr(self, "extra", {}), **(extra or {}),
                              **({"units": self.units} if self.units else {})},
                       fleet=self.fleet)
        return summary


def to_json(summary: pl.DataFrame) -> str:
    rows = summary.to_dicts()
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float) and v != v:
                row[k] = None
    return json.dumps(rows, indent=2)
