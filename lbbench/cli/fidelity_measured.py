"""``lbbench fidelity --measured FILE``: the simulator against measured runs of real GPU servers.

Thin: reads the rows and the calibration, calls ``lbbench.validation``, prints the tables and writes the outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import polars as pl

from ..errors import InputError
from ..measured.table import read_measured
from ..profiling.calibration import load_calibration
from ..validation.report import mape_by, render_text, write_outputs
from ..validation.setup import MLPERF_CNNDM_PROMPTS, PromptAssumption, value
from ..validation.simulate import simulate_rows


def run_measured(measured: str, calibration: str | None, prompt_assumption: str | None, jobs: int,
                 out_dir: str | None, fmt: str, sensitivity: bool, max_mape: str | None) -> None:
    table = read_measured(measured, strict=False)  # the good rows run; each bad one is reported below
    rows = table.rows
    cal = load_calibration(calibration)
    prompts = _prompt_assumption(prompt_assumption) if prompt_assumption else None
    frame = simulate_rows(rows, cal.eff, eff_source=cal.describe(), api_overhead_s=cal.api_overhead_s,
                          prompts=prompts, jobs=jobs)
    title = f"Simulator against {Path(measured).name} ({cal.describe()})"
    extra = []
    if sensitivity:
        base = prompts or MLPERF_CNNDM_PROMPTS
        for mean in (800.0, 1250.0):
            alt = PromptAssumption(mean, base.cv, base.lo, base.hi, f"{base.source}, mean moved to {mean:g}")
            f2 = simulate_rows([r for r in rows if value(r, "prompt_tokens_mean") is None
                                and value(r, "prefix_groups") is None],
                               cal.eff, api_overhead_s=cal.api_overhead_s, prompts=alt, jobs=jobs)
            extra.append((mean, f2))
    if out_dir is not None:
        write_outputs(frame, out_dir, title)
    if fmt == "json":
        summary = mape_by(frame).to_dicts()
        click.echo(json.dumps({"calibration": cal.describe(), "mape": summary,
                               "not_covered": frame.filter(pl.col("not_covered").is_not_null())
                               .select("id", "not_covered").to_dicts()}, indent=2, default=str))
    else:
        click.echo(render_text(frame, title))
        for mean, f2 in extra:
            if f2.height:
                d = f2.filter(pl.col("metric").is_in(["ttft_mean_ms", "e2e_mean_ms", "tpot_p50_ms", "ttft_p99_ms"]))
                click.echo(f"\nPrompt-length sensitivity, assumed mean {mean:g} tokens:")
                for i, m, meas, pred, err in d.select("id", "metric", "measured", "predicted", "error_pct").iter_rows():
                    click.echo(f"  {i} {m}: measured {meas:.1f}, simulated {pred:.1f} ({err:+.1f} %)")
    for problem in table.problems:
        click.echo(f"Error: {problem}", err=True)
    if table.problems:
        raise SystemExit(2)
    if max_mape:
        _gate(frame, max_mape)


def _prompt_assumption(text: str):
    try:
        mean_s, cv_s = text.split(":")
        mean, cv = float(mean_s), float(cv_s)
    except ValueError:
        raise InputError(f"prompt_assumption: expected MEAN:CV, got {text!r}") from None
    if mean < 2 or cv < 0:
        raise InputError(f"prompt_assumption: MEAN must be >= 2 and CV >= 0, got {text!r}")
    return PromptAssumption(mean, cv, 1, int(mean * 8), f"given: lognormal mean {mean:g}, CV {cv:g}")


def _gate(frame, spec: str) -> None:
    """``e2e_mean_ms=10,ttft_mean_ms=20``: exit 1 when a metric's MAPE exceeds its bound."""
    agg = {m: v for m, v in mape_by(frame).select("metric", "mape").iter_rows()}
    failed = []
    for item in spec.split(","):
        name, eq, bound = item.partition("=")
        try:
            limit = float(bound)
        except ValueError:
            raise InputError(f"max_mape: expected METRIC=PERCENT, got {item!r}") from None
        if not eq or name not in agg:
            raise InputError(f"max_mape: unknown metric {name!r} (have: {', '.join(sorted(agg))})")
        if agg[name] > limit:
            failed.append(f"{name} MAPE {agg[name]:.1f} % > {limit:g} %")
    if failed:
        click.echo("Error: " + "; ".join(failed), err=True)
        raise SystemExit(1)
