"""``lbbench report`` and ``lbbench compare``: the click commands over run directories.

Thin: parse flags, call ``lbbench.reports``, print or write. The main CLI adds both
commands (``cli.add_command(report)``, ``cli.add_command(compare)``). Bad input (a run directory that cannot
be read: ``lbbench.rundir.RunDirError``, an ``InputError``) is one line naming the flag or path and exit code 2,
from the group's handler; ``compare`` exits 1 on a regression.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from rich.console import Console

from ..reports.compare import (DEFAULT_METRICS, METRICS, CompareError, compare_runs, parse_pairs,
                              parse_threshold)
from ..reports.compare_render import render_comparison
from ..reports.render import to_rich
from ..reports.report import FORMATS, build_report, write_plots
from ..reports.tables import Slo
from .flags import parse_slo, user_message


def _slo_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> Slo | None:
    return parse_slo(value)


@click.command("report")
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_DIR...")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="Console table, Markdown, JSON, or a self-contained HTML file.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write here instead of stdout (HTML default: RUN_DIR/report.html).")
@click.option("--slo", callback=_slo_callback, metavar="ttft=S,tbt=S,e2e=S",
              help="Add a goodput table: share of requests within these limits (seconds).")
@click.option("--baseline", default="round_robin", show_default=True,
              help="Router that improvements are measured against.")
@click.option("--bootstrap", "num_resamples", type=click.IntRange(100, 100_000), default=1000,
              show_default=True, help="Bootstrap resamples for confidence intervals.")
@click.option("--no-plots", is_flag=True, help="HTML without plots (faster).")
@click.option("--plots", "plots_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also write every plot as a PNG file into this directory.")
@click.option("--wide", is_flag=True, default=False,
              help="Console tables with every column (seeds, differences in seconds, p90, max TBT, throughput, "
                   "...), not only those that fit a 120-column terminal. Markdown, JSON and HTML hold them all.")
def report(run_dirs: tuple[str, ...], fmt: str, out: Path | None, slo: Slo | None, baseline: str,
           num_resamples: int, no_plots: bool, plots_dir: Path | None, wide: bool) -> None:
    """Paper-style tables, latency detail, goodput and plots for one or more runs.

    Runs that differ in a setting (profile, chunked prefill, ...) are grouped by it; runs
    that differ in profile are also laid side by side.
    """
    rep = build_report(run_dirs, baseline=baseline, slo=slo, num_resamples=num_resamples)
    if plots_dir is not None:
        for p in write_plots(rep, plots_dir):
            click.echo(f"wrote {p}", err=True)
    if fmt == "table" and out is None and sys.stdout.isatty():
        to_rich(rep.tables, Console(), rep.preamble(), wide)  # the terminal's own width
        return
    text = rep.render(fmt, plots=not no_plots, wide=wide)
    if fmt == "html" and out is None:
        first = Path(run_dirs[0])
        out = (first if first.is_dir() else first.parent) / "report.html"
    if out is None:
        click.echo(text, nl=not text.endswith("\n"))
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    click.echo(f"wrote {out}", err=True)


@click.command("compare")
@click.argument("baseline", metavar="BASELINE")
@click.argument("candidate", metavar="CANDIDATE")
@click.option("--max-regression", default="3%", show_default=True,
              help="Fail when a metric is worse by more than this (percent) and its CI excludes 0.")
@click.option("--metric", "metrics", multiple=True, metavar="NAME",
              help=f"Metric to compare (repeatable; default {', '.join(DEFAULT_METRICS)}; "
                   f"known: {', '.join(METRICS)}).")
@click.option("--pair", "pairs", multiple=True, metavar="A=B",
              help="Compare baseline router A with candidate router B (repeatable).")
@click.option("--format", "fmt", type=click.Choice(("table", "markdown", "json")), default="table",
              show_default=True)
@click.option("--bootstrap", "num_resamples", type=click.IntRange(100, 100_000), default=1000,
              show_default=True, help="Bootstrap resamples.")
@click.option("--level", type=click.FloatRange(0.5, 0.999), default=0.95, show_default=True,
              help="Confidence level of the intervals.")
def compare(baseline: str, candidate: str, max_regression: str, metrics: tuple[str, ...],
            pairs: tuple[str, ...], fmt: str, num_resamples: int, level: float) -> None:
    """Compare CANDIDATE runs against BASELINE runs; exit 1 on a significant regression."""
    try:
        threshold = parse_threshold(max_regression)
        pair_list = parse_pairs(pairs)
        result = compare_runs(baseline, candidate, metrics or DEFAULT_METRICS, threshold, pair_list,
                              num_resamples, level)
    except CompareError as exc:
        msg = user_message(exc)
        if msg.startswith("--"):  # a flag's value: click's own form, with the usage line
            flag, _, rest = msg.partition(": ")
            raise click.BadParameter(rest, param_hint=f"'{flag}'") from None
        raise  # what the runs hold: the group's one line
    if fmt == "json":
        click.echo(json.dumps(render_comparison(result, "json"), indent=2, default=str))
    else:
        click.echo(render_comparison(result, fmt), nl=False)
    if result.regressed:
        raise SystemExit(1)
