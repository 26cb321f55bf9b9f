"""Nightly history (``lbbench history``): many nightly run directories, each judged against one baseline.

Each night is compared with the baseline by ``compare.compare_runs`` itself — the same pairing, bootstrap interval,
threshold and verdict as ``lbbench compare BASELINE NIGHT`` — so a night marked failed here is one whose
``compare`` exits 1. Nights are ordered by ``run.toml``'s ``created`` (when the run started; ties and runs without
one keep the order given) and named by a label (the directory's name unless given).

``History`` holds one row per night × router (and each setting that varies inside the runs) × metric: the night's
value, the baseline's, the change and its interval, the verdict. Goodput and SLO attainment, when the runs have an
SLO, are shown per night too; ``compare`` has no interval for them, so they are not gated.

``History.tables()`` gives one table per metric (rows: nights; columns: routers) and one of the nights with their
verdicts; ``render`` writes them as a console table, Markdown, JSON or an HTML page with one plot per metric
(``history_plots``).
"""

from __future__ import annotations

import io
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import polars as pl
from rich.console import Console

from ..metrics.summary import Slo, summarize
from ..rundir import REQUESTS_FILE, RunDirError, group_keys, load_runs, read_run_toml
from . import render as R
from .compare import DEFAULT_METRICS, METRICS, CompareError, compare_runs
from .tables import Table

#: shown per night when the runs have an SLO; ``compare`` has no interval for them, so they are not gated
SLO_METRICS = ("goodput_per_s", "slo_attainment")
LABELS = {"mean_e2e_s": "mean E2E (s)", "p50_e2e_s": "p50 E2E (s)", "p90_e2e_s": "p90 E2E (s)",
          "p99_e2e_s": "p99 E2E (s)", "mean_ttft_s": "mean TTFT (s)", "p99_ttft_s": "p99 TTFT (s)",
          "mean_tbt_s": "mean TBT (s)", "p99_tbt_s": "p99 TBT (s)", "mean_router_wait_s": "mean router wait (s)",
          "throughput_tokens_per_s": "throughput (tokens/s)", "goodput_per_s": "goodput (requests/s)",
          "slo_attainment": "SLO attainment"}
#: the metrics of a history by default: compare's, and p99 TTFT
HISTORY_METRICS = (*DEFAULT_METRICS, "p99_ttft_s")


@dataclass(frozen=True)
class Night:
    """One nightly run directory: its label, when it started, its revision, whether it completed."""

    label: str
    path: Path
    created: str | None
    revision: str | None
    complete: bool


@dataclass
class History:
    nights: list[Night]
    baseline: Path
    metrics: list[str]
    max_regression_pct: float
    #: one row per night x group x metric: night, group, metric, value, baseline, change_pct, ci_low_pct,
    #: ci_high_pct, verdict, regression, gated
    rows: pl.DataFrame
    warnings: list[str] = field(default_factory=list)

    def groups(self) -> list[str]:
        return self.rows["group"].unique(maintain_order=True).to_list() if self.rows.height else []

    def failed(self) -> dict[str, list[str]]:
        """The nights that failed the gate: label -> what regressed (``GROUP METRIC +x.x%``), worst first."""
        out: dict[str, list[str]] = {}
        bad = self.rows.filter(pl.col("regression")).sort("change_pct", descending=True, maintain_order=True)
        for r in bad.iter_rows(named=True):
            out.setdefault(r["night"], []).append(f"{r['group']} {r['metric']} {r['change_pct']:+.1f}%")
        return out

    def metric_rows(self, metric: str) -> pl.DataFrame:
        return self.rows.filter(pl.col("metric") == metric)

    def tables(self) -> list[Table]:
        """The nights with their verdicts, then one table per metric: a row per night, a column per group."""
        failed = self.failed()
        nights = pl.DataFrame({
            "night": [n.label for n in self.nights],
            "started": [_when(n.created) for n in self.nights],
            "revision": [(n.revision or "-")[:10] for n in self.nights],
            "gate": [("baseline" if n.path == self.baseline else
                      f"FAIL: {len(failed[n.label])} worse (worst: {failed[n.label][0]})" if n.label in failed
                      else "ok")
                     + ("" if n.complete else " (incomplete)") for n in self.nights],
        })
        note = (f"Gate: lbbench compare against the baseline; a night fails when a metric is worse by more than "
                f"{self.max_regression_pct:g}% with its interval excluding 0.")
        out = [Table("nights", "Nights", nights, note, ["night"])]
        for m in self.metrics:
            rows = self.metric_rows(m)
            if not rows.height:
                continue
            gated = m in METRICS
            cells: dict[str, dict[str, str]] = {}
            for r in rows.iter_rows(named=True):
                cells.setdefault(r["night"], {})[r["group"]] = _cell(r, gated, self.nights, self.baseline)
            df = pl.DataFrame([{"night": n.label, **{g: cells.get(n.label, {}).get(g, "-") for g in self.groups()}}
                               for n in self.nights], schema={"night": pl.Utf8, **{g: pl.Utf8 for g in self.groups()}})
            note = ("Value (change against the baseline, %); FAIL: worse by more than the threshold with the "
                    "interval excluding 0." if gated else "Value per night; not gated (compare has no interval "
                    "for it).")
            out.append(Table(m, f"{LABELS.get(m, m)} by night", df, note, ["night"], headers={g: g for g in
                                                                                                 self.groups()}))
        return out

    def baseline_label(self) -> str:
        """The baseline night's label, or the baseline's path when it is not one of the nights."""
        return next((n.label for n in self.nights if n.path == self.baseline), str(self.baseline))

    def preamble(self) -> str:
        lines = [f"- baseline: {self.baseline_label()}", f"- nights: {len(self.nights)}, oldest first"]
        return "\n".join(lines + [f"- warning: {w}" for w in self.warnings])

    def render(self, fmt: str, width: int = 120) -> str:
        """``table`` (console text at ``width`` columns), ``markdown``, ``json`` or ``html`` (plots included)."""
        if fmt == "markdown":
            return R.to_markdown(self.tables(), "lbbench history", self.preamble())
        if fmt == "json":
            return json.dumps({"baseline": str(self.baseline), "max_regression_pct": self.max_regression_pct,
                               "nights": [{"label": n.label, "path": str(n.path), "created": n.created,
                                           "revision": n.revision, "complete": n.complete} for n in self.nights],
                               "failed": self.failed(), "warnings": self.warnings,
                               "rows": [{k: _finite(v) for k, v in r.items()} for r in self.rows.to_dicts()]},
                              indent=2)
        if fmt == "html":
            from .history_plots import history_plots  # lazy: optional extra (matplotlib)
            from .html import to_html  # lazy: as above
            return to_html(self.preamble(), self.tables(), list(history_plots(self)), title="lbbench history")
        if fmt == "table":
            buf = io.StringIO()
            R.to_rich(self.tables(), Console(file=buf, width=width, force_terminal=False), self.preamble())
            return buf.getvalue()
        raise ValueError(f"format: unknown format {fmt!r} (choose from table, markdown, json, html)")


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _when(created: str | None) -> str:
    return created.replace("T", " ").removesuffix("+00:00")[:16] if created else "-"


def _num(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    a = abs(v)
    return f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3f}"


def _cell(r: dict[str, Any], gated: bool, nights: list[Night], baseline: Path) -> str:
    value = f"{100 * r['value']:.1f} %" if r["metric"] == "slo_attainment" and r["value"] is not None \
        else _num(r["value"])
    if not gated or r["change_pct"] is None:
        return value
    if any(n.label == r["night"] and n.path == baseline for n in nights):
        return f"{value} (base)"
    return f"{value} ({r['change_pct']:+.1f}%)" + (" FAIL" if r["regression"] else "")


def night_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """The run directories ``paths`` name: a run directory itself, or every one below a directory of them."""
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / REQUESTS_FILE).is_file():
            found = [p]
        elif p.is_dir():
            found = sorted(f.parent for f in p.rglob(REQUESTS_FILE))
        else:
            raise RunDirError(f"{p}: no such run directory")
        if not found:
            raise RunDirError(f"{p}: no {REQUESTS_FILE} here or below (is it a run directory?)")
        out += [d for d in found if d.resolve() not in {x.resolve() for x in out}]
    return out


def _night(path: Path, label: str) -> Night:
    try:
        doc = read_run_toml(path)
    except tomllib.TOMLDecodeError as exc:
        raise RunDirError(f"{path}/run.toml: not valid TOML: {exc}") from None
    rev = doc.get("git_revision")
    return Night(label, path, doc.get("created"), None if rev in (None, "unknown") else rev,
                 bool(doc.get("complete", True)))


def _labels(dirs: list[Path], given: Sequence[str]) -> list[str]:
    if given:
        if len(given) != len(dirs):
            raise RunDirError(f"label: {len(given)} labels for {len(dirs)} nights; give one per night, in order")
        return list(given)
    names = [d.name for d in dirs]
    return [f"{d.parent.name}/{d.name}" if names.count(d.name) > 1 else d.name for d in dirs]


def _slo(nights: list[Night], slo: Slo | None, warnings: list[str]) -> Slo | None:
    """The SLO goodput is counted against: given, else the one every night recorded (none when they differ)."""
    if slo is not None:
        return slo
    recorded = [read_run_toml(n.path).get("config", {}).get("slo") or None for n in nights]
    if recorded and all(s == recorded[0] for s in recorded) and recorded[0]:
        return Slo(**recorded[0])
    if any(recorded):
        warnings.append("the nights recorded different SLOs; give --slo for goodput and attainment")
    return None


def build_history(paths: Sequence[str | Path], baseline: str | Path | None = None,
                  metrics: Sequence[str] = HISTORY_METRICS, max_regression_pct: float = 3.0,
                  labels: Sequence[str] = (), slo: Slo | None = None, num_resamples: int = 1000,
                  level: float = 0.95) -> History:
    """Every night of ``paths`` judged against ``baseline`` (default: the oldest night) by ``compare_runs``."""
    unknown = [m for m in metrics if m not in METRICS and m not in SLO_METRICS]
    if unknown:
        raise CompareError(f"metric: unknown metric(s) {', '.join(unknown)} (known: "
                           f"{', '.join([*METRICS, *SLO_METRICS])})")
    dirs = night_dirs(paths)
    given = [_night(d, label) for d, label in zip(dirs, _labels(dirs, labels))]
    warnings: list[str] = []
    if all(n.created for n in given):
        nights = sorted(given, key=lambda n: n.created or "")  # stable: ties keep the order given
    else:
        nights = given
        warnings.append("some nights have no run.toml start time; they are in the order given")
    base = Path(baseline) if baseline is not None else nights[0].path
    night_of_base = next((n for n in nights if n.path.resolve() == base.resolve()), None)
    if night_of_base is not None:
        base = night_of_base.path
    gate_metrics = [m for m in metrics if m in METRICS]
    rows: list[dict[str, Any]] = []
    for n in nights:
        cmp = compare_runs(base, n.path, gate_metrics, max_regression_pct, (), num_resamples, level)
        warnings += [f"{n.label}: {w}" for w in cmp.warnings if f"{n.label}: {w}" not in warnings]
        for r in cmp.rows:
            c = r.change
            rows.append({"night": n.label, "group": _group(r.candidate_router, r.settings), "metric": r.metric,
                         "value": c.candidate, "baseline": c.baseline, "change_pct": c.change_pct,
                         "ci_low_pct": c.ci_low_pct, "ci_high_pct": c.ci_high_pct, "verdict": r.verdict,
                         "regression": r.regression, "gated": r.gated})
    slo = _slo(nights, slo, warnings)
    if slo is not None:
        for n in nights:
            runs = load_runs([n.path])
            keys = [k for k in group_keys(runs.requests) if k != "run"]
            for s in summarize(runs.requests, by=keys, slo=slo).iter_rows(named=True):
                settings = {k: s[k] for k in keys if k != "router"}
                for m in SLO_METRICS:
                    rows.append({"night": n.label, "group": _group(s["router"], settings), "metric": m,
                                 "value": s.get(m), "baseline": None, "change_pct": None, "ci_low_pct": None,
                                 "ci_high_pct": None, "verdict": "not gated", "regression": False, "gated": False})
    schema = {"night": pl.Utf8, "group": pl.Utf8, "metric": pl.Utf8, "value": pl.Float64, "baseline": pl.Float64,
              "change_pct": pl.Float64, "ci_low_pct": pl.Float64, "ci_high_pct": pl.Float64, "verdict": pl.Utf8,
              "regression": pl.Boolean, "gated": pl.Boolean}
    shown = [*gate_metrics, *(SLO_METRICS if slo is not None else ())]
    return History(nights, base, shown, max_regression_pct, pl.DataFrame(rows, schema=schema), warnings)


def _group(router: str, settings: dict[str, Any]) -> str:
    return router + (f" ({', '.join(f'{k}={v}' for k, v in settings.items())})" if settings else "")
