"""``lbbench run --find-rate``: the flags' config -> ``planning.find_rate`` -> a table or JSON.

The search and its run directories are ``lbbench.planning.find_rate``'s; this module only reads the flags and
renders, so that planning never imports the command line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from ..experiment import Reporter, RunConfig, default_out_dir
from ..planning.find_rate import FindRateConfig, find_rates, print_rates
from ..profiles import load_profile
from ..metrics.summary import Slo
from .common import err_console


class NoteReporter(Reporter):
    """Notes (each probe's outcome) to a console; unit progress is not drawn."""

    def __init__(self, console: Any):
        self.console = console

    def note(self, message: str, warning: bool = False) -> None:
        self.console.print(f"[yellow]warning: {message}[/yellow]" if warning else message, highlight=False,
                           soft_wrap=True)


def find_rate_cli(run: RunConfig, kw: dict[str, Any]) -> None:
    """``lbbench run --find-rate``: the flags' config (unresolved) -> the rows -> a table (or JSON)."""
    fc = FindRateConfig(run, attainment=kw["attainment"], start_per_s=kw["find_rate_start"],
                        rel_tol=kw["find_rate_tol"], max_rate_per_s=kw["find_rate_max"])
    fc.check()
    cfg = run.resolved()
    profile = load_profile(cfg.profile)
    cfg.check(profile)
    out_dir = Path(kw["out_dir"]) if kw["out_dir"] else default_out_dir(cfg)
    t0 = time.perf_counter()
    rows = find_rates(fc, out_dir, profile, reporter=NoteReporter(err_console))
    wall_s = time.perf_counter() - t0
    if kw["fmt"] == "json":
        print(json.dumps({"rows": [r.record() for r in rows], "wall_s": round(wall_s, 3)}, indent=2))
        return
    where = f"live x{cfg.instances}" if cfg.live else f"{cfg.profile} x{cfg.instances}"
    title = (f"highest rate with {100 * fc.attainment:g} % within {Slo(**cfg.slo).describe()}: {where}, "
             f"{cfg.trace or cfg.workload}, {cfg.requests or 'all'} requests, {cfg.seeds} paired seed(s)")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    print_rates(rows, fc, title, console)
    console.print(f"[dim]{wall_s:.1f} s; every probe's runs are in {out_dir}/<router>-<scheduler>/rate<R>/"
                  f"seed<S>/, the rows in {out_dir}/find_rate.json[/dim]", highlight=False)
