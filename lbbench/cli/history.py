"""``lbbench history``: many nightly run directories as one table per metric and an HTML page of plots.

Thin: parse flags, call ``lbbench.reports.history`` (which judges every night with ``lbbench compare``'s own
statistics against one baseline), print the tables and write the page. A separate command rather than
``report --history``: ``report`` pools its runs as one set grouped by their settings, while a history keeps each
night apart, in time order, each against the same baseline and gate.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from ..reports.compare import METRICS, parse_threshold
from ..reports.history import HISTORY_METRICS, SLO_METRICS, build_history
from ..reports.render import to_rich
from .flags import parse_slo


@click.command("history")
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_DIR...")
@click.option("--baseline", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="The run every night is compared with, as `lbbench compare BASELINE NIGHT` would "
                   "[default: the oldest night].")
@click.option("--label", "labels", multiple=True, metavar="NAME",
              help="A name for each night, in the order the run directories are given (repeat once per night; "
                   "default: the directory's name).")
@click.option("--metric", "metrics", multiple=True, metavar="NAME",
              help=f"Metric to follow (repeatable; default {', '.join(HISTORY_METRICS)}, and "
                   f"{', '.join(SLO_METRICS)} when the runs have an SLO; known: "
                   f"{', '.join([*METRICS, *SLO_METRICS])}).")
@click.option("--max-regression", default="3%", show_default=True,
              help="The gate: a night fails when a metric is worse by more than this and its interval excludes 0.")
@click.option("--slo", default=None, metavar="ttft=S,tbt=S,e2e=S",
              help="Latency limits for goodput and attainment (default: the SLO the nights recorded).")
@click.option("--format", "fmt", type=click.Choice(("table", "markdown", "json")), default="table",
              show_default=True, help="What is printed.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path), default=Path("history.html"),
              show_default=True, help="Where the HTML page (tables and one plot per metric) is written.")
@click.option("--no-html", is_flag=True, default=False, help="Print the tables only.")
@click.option("--bootstrap", "num_resamples", type=click.IntRange(100, 100_000), default=1000,
              show_default=True, help="Bootstrap resamples of each night's comparison.")
@click.option("--level", type=click.FloatRange(0.5, 0.999), default=0.95, show_default=True,
              help="Confidence level of the intervals.")
def history(run_dirs: tuple[str, ...], baseline: Path | None, labels: tuple[str, ...], metrics: tuple[str, ...],
            max_regression: str, slo: str | None, fmt: str, html_out: Path, no_html: bool, num_resamples: int,
            level: float) -> None:
    """Each metric over the nights, per router, each night judged against one baseline by `lbbench compare`.

    RUN_DIR is a nightly run directory, or a directory of them (every run directory below it is a night).
    Nights are ordered by when they started (run.toml). Prints a table per metric and writes an HTML page with
    one plot per metric; the nights that failed the gate are marked in both.

    \b
    Examples:
      lbbench history nightly/ --baseline baselines/paper-mix-v100
      lbbench history nightly/2025-06-0* --metric p99_e2e_s --format markdown --no-html
    """
    hist = build_history(run_dirs, baseline, metrics or HISTORY_METRICS, parse_threshold(max_regression),
                         labels, parse_slo(slo), num_resamples, level)  # its errors are InputErrors (exit 2)
    if fmt == "table" and sys.stdout.isatty():
        to_rich(hist.tables(), Console(), hist.preamble())  # the terminal's own width
    else:
        text = hist.render(fmt)
        click.echo(text, nl=not text.endswith("\n"))
    if not no_html:
        html_out.parent.mkdir(parents=True, exist_ok=True)
        html_out.write_text(hist.render("html"))
        click.echo(f"wrote {html_out}", err=True)
