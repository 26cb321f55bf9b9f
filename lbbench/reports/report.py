"""One report over many run directories: load, group, build tables, render.

``build_report`` decides the grouping from the data (``load.group_keys``) and builds every
table that applies; ``Report.render(fmt)`` turns it into a rich console table, Markdown,
JSON or a self-contained HTML page (``html.py``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import polars as pl
from rich.console import Console

from ..metrics.admitted import admitted_load_line, shed_expr
from ..metrics.summary import summarize
from ..rundir import Runs, load_runs, read_decisions, settings_of
from . import render as R
from .decisions import decision_tables
from .html import to_html
from .disagg import disagg_table
from .tables import Slo, Table, build_tables

FORMATS = ("table", "markdown", "json", "html")


@dataclass
class Report:
    runs: Runs
    keys: list[str]
    tables: list[Table]
    baseline: str = "round_robin"
    warnings: list[str] = field(default_factory=list)
    slo: Slo | None = None

    def table(self, name: str) -> Table | None:
        return next((t for t in self.tables if t.name == name), None)

    def run_rows(self) -> list[dict[str, Any]]:
        """One dict per run: label, settings, routers, seeds, completeness."""
        out = []
        for info in self.runs.infos:
            lf = self.runs.requests.filter(pl.col("run") == info.label)
            s = settings_of(lf)
            meta = lf.select(pl.col("router").unique(maintain_order=True).implode(),
                             pl.col("seed").unique().sort().implode(), pl.len()).collect().row(0)
            out.append({"run": info.label, "complete": info.complete,
                        **{k: (v[0] if len(v) == 1 else v) for k, v in s.items()},
                        "routers": meta[0], "seeds": meta[1], "requests": meta[2]})
        return out

    def preamble(self) -> str:
        lines = []
        for r in self.run_rows():
            parts = [f"{k}={r[k]}" for k in ("backend", "profile", "workload", "num_instances",
                                              "rate_per_s") if k in r]
            seeds = r["seeds"]
            seed_txt = f"seeds {seeds[0]}..{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}"
            flag = "" if r["complete"] else " [INCOMPLETE]"
            lines.append(f"- run {r['run']}{flag}: {', '.join(parts)}; routers "
                         f"{', '.join(map(str, r['routers']))}; {seed_txt}; {r['requests']} requests")
        lines.append(f"- grouped by: {', '.join(self.keys)}")
        lines += [f"- warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def figures(self) -> Iterator[Any]:
        """Every figure of the report (``plots.Plot``s), in page order."""
        from .plots import report_plots  # lazy: optional extra (matplotlib)

        main = self.table("main")
        timelines = [(info.label, info.timeline()) for info in self.runs.infos]
        return report_plots(self.runs.requests, self.keys, self.baseline, None if main is None else main.df,
                            self.slo, timelines)

    def render(self, fmt: str, plots: bool = True, wide: bool = True) -> str:
        """The report as ``fmt``; ``wide`` (console table only): every column, else those that fit 120."""
        if fmt == "markdown":
            return R.to_markdown(self.tables, "lbbench report", self.preamble())
        if fmt == "json":
            return R.to_json(self.tables, {"group_keys": self.keys, "baseline": self.baseline,
                                           "runs": self.run_rows(), "warnings": self.warnings})
        if fmt == "html":
            return to_html(self.preamble(), self.tables, self.figures() if plots else [])
        if fmt == "table":
            buf = io.StringIO()
            R.to_rich(self.tables, Console(file=buf, width=200, force_terminal=False),
                      self.preamble(), wide)
            return buf.getvalue()
        raise ValueError(f"format: unknown format {fmt!r} (choose from {', '.join(FORMATS)})")


def build_report(paths: Sequence[str | Path], baseline: str = "round_robin", slo: Slo | None = None,
                 num_resamples: int = 1000) -> Report:
    runs = load_runs(paths)
    keys = runs.group_keys()
    warnings = [f"run {i.label} is incomplete (interrupted); its finished requests are included"
                for i in runs.infos if not i.complete]
    if "run" in keys:
        warnings.append("several runs repeat the same settings and seeds; grouping by run")
    routers = runs.requests.select(pl.col("router").unique()).collect().to_series().to_list()
    if baseline not in routers:
        warnings.append(f"baseline router {baseline!r} is not in these runs; improvements are empty")
    if runs.requests.select(shed_expr().any()).collect().item():  # flow control shed requests: say the admitted load
        warnings.append(admitted_load_line(summarize(runs.requests, by=keys, slo=slo)) or "")
    tables = build_tables(runs.requests, keys, baseline, slo, num_resamples)
    pd = disagg_table(runs.requests, keys)  # prefill/decode fleets: the TTFT split and transfers
    if pd is not None:
        tables.append(pd)
    tables += decision_tables(read_decisions([(i.label, i.path) for i in runs.infos]))
    return Report(runs, keys, tables, baseline, warnings, slo)


def write_plots(report: Report, directory: str | Path) -> list[Path]:
    """Write every figure of the report as ``DIRECTORY/<name>.png``; returns the paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fig in report.figures():
        p = out / f"{fig.name}.png"
        p.write_bytes(fig.png)
        paths.append(p)
    return paths
