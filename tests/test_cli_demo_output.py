"""What ``make demo`` prints: one saturation line for the run, and a summary table that fits a 120-column terminal
(``--wide`` on ``run`` and ``report`` for every column). The demo's command is read from the Makefile."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from rich.console import Console

from lbbench.cli import main
from lbbench.cli.run import summary_table
from lbbench.experiment import RunConfig
from lbbench.experiment.units import Saturation, saturation_line
from lbbench.reports.report import build_report

ROOT = Path(__file__).resolve().parents[1]


def demo_args() -> list[str]:
    """``make demo``'s ``lbbench`` arguments, as the Makefile's recipe gives them."""
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    words = shlex.split(recipe.replace("\\\n", " "))
    return words[words.index("$(BIN)/lbbench") + 1:]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo run as ``make demo`` runs it, in a fresh directory (its ``--out runs/demo`` is relative)."""
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("demo"))
    try:
        res = CliRunner().invoke(main, demo_args(), catch_exceptions=False)
        out = Path(demo_args()[demo_args().index("--out") + 1]).resolve()
    finally:
        os.chdir(here)
    assert res.exit_code == 0, res.output
    return res, out


def _lines(renderable, width: int) -> list[str]:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(renderable)
    return console.export_text().splitlines()


def test_the_demo_says_once_that_it_saturated(demo):
    res, _ = demo
    marks = [ln for ln in res.stderr.splitlines() if "saturated" in ln]
    assert marks == ["saturated (the backlog kept growing) at 30.0 s, marked, not stopped: "
                     "round_robin, jsq, min_min, mcu (seeds 0-2)"]


def test_the_demo_table_fits_120_columns(demo):
    res, out = demo
    assert max(len(ln) for ln in res.stdout.splitlines()) <= 120
    summary = pl.read_parquet(out / "summary.parquet")
    cfg = RunConfig(routers=["round_robin", "jsq", "min_min", "mcu"], seeds=3).resolved()
    default = _lines(summary_table(summary, cfg), 300)  # the table's own width, nothing squeezed
    assert max(map(len, default)) <= 120
    assert _lines(summary_table(summary, cfg), 120) == default  # so a 120-column terminal wraps nothing
    head = next(ln for ln in default if "router" in ln)
    assert [c.strip() for c in head.strip("┃").split("┃")] == [
        "router", "mean E2E (s)", "vs RR (%)", "p50 E2E", "p99 E2E", "mean TTFT", "p99 TTFT", "preempt.", "saturated"]
    wide = next(ln for ln in _lines(summary_table(summary, cfg, wide=True), 400) if "router" in ln)
    assert all(h in wide for h in ("vs best (%)", "TBT", "router wait", "tok/s", "goodput/s", "done", "failed"))


def test_report_fits_120_columns_unless_wide(demo):
    _, out = demo
    rep = build_report([out], num_resamples=100)
    table_lines = [ln for ln in rep.render("table", wide=False).splitlines() if ln[:1] in "┏┃│┡└"]
    assert max(map(len, table_lines)) <= 120
    wide = rep.render("table")
    assert "diff vs round_robin (s)" in wide and "p90 E2E (s)" in wide and "throughput (tok/s)" in wide
    res = CliRunner().invoke(main, ["report", str(out), "--wide"])
    assert res.exit_code == 0 and "p90 E2E (s)" in res.stdout


def test_saturation_line_groups_routers_by_seeds_and_variants():
    marks = [Saturation("jsq", s, "", 30.0, False, 0) for s in (0, 1, 2, 3)]
    marks += [Saturation("round_robin", s, "", 31.24, False, 0) for s in (0, 2)]
    assert saturation_line(marks) == ("saturated (the backlog kept growing) at 30.0-31.2 s, marked, not stopped: "
                                      "jsq (seeds 0-3); round_robin (seeds 0, 2)")
    live = [Saturation(r, 0, "rate80", 12.0, True, n) for r, n in (("jsq", 300), ("round_robin", 212))]
    live += [Saturation("jsq", 0, "rate120", 8.5, True, 500)]
    assert saturation_line(live) == ("saturated (the backlog kept growing) at 8.5-12.0 s, sending stopped, 1012 "
                                     "requests not sent or cancelled: rate80: jsq, round_robin (seed 0) | "
                                     "rate120: jsq (seed 0)")
    assert saturation_line([]) is None
