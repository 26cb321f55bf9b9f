"""``lbbench profile fit --measured FILE``: fit the roofline's efficiency factors to measured GPU runs.

Thin: reads the rows and a starting calibration, calls ``lbbench.validation.fit``, writes the calibration file
and, with ``--cross-validate``, the errors on held-out models / GPUs / TP degrees.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import click

from ..errors import InputError
from ..validation.fit import FIT_BOUNDS


@click.command("fit")
@click.option("--measured", required=True, type=click.Path(dir_okay=False),
              help="Measured-runs table to fit on (the measured-runs schema; lbbench measured import writes it).")
@click.option("--calibration", "start", default=None, type=click.Path(dir_okay=False),
              help="Calibration to start from (default: the one shipped with lbbench).")
@click.option("--params", default=",".join(FIT_BOUNDS), show_default=True,
              help="Comma-separated factors to fit (the others stay as the starting calibration has them).")
@click.option("--rounds", type=click.IntRange(0, 10), default=2, show_default=True,
              help="Coordinate-descent rounds over the factors (0: keep the starting calibration as it is, e.g. to "
                   "cross-validate it; the held-out refits then run one round).")
@click.option("--max-stage-s", type=click.FloatRange(min=10), default=None,
              help="Simulate only the first seconds of each stage while fitting (faster; checked on full runs).")
@click.option("--cross-validate", "cross", default=None,
              help="Comma-separated columns (model, gpu, tp): refit with each value held out and report the "
                   "error on the held-out rows.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Calibration TOML to write.")
@click.option("--report-dir", default=None, type=click.Path(file_okay=False),
              help="Write the fitted rows' and the held-out rows' fidelity tables (text, Parquet, HTML) here.")
def fit_cmd(measured: str, start: str | None, params: str, rounds: int, max_stage_s: float | None,
            cross: str | None, jobs: int, out: str, report_dir: str | None) -> None:
    """Fit the efficiency factors (weight and KV bandwidth use, per-step and per-layer overheads, all-reduce
    latency, the front end's latency) to every row of a measured-runs table: one set, never per row. Reports the
    fitted rows' errors and, with --cross-validate, the errors on rows held out of the fit."""
    from ..distributed import get_executor  # lazy: the executors pull in multiprocessing machinery
    from ..measured.table import read_measured  # lazy: start-up time (the measured tables, ~30 ms)
    from ..profiling.calibration import Calibration, load_calibration, write_calibration  # lazy: as above
    from ..validation.fit import cross_validate, fit  # lazy: start-up time (the simulator and its profiles)
    from ..validation.report import render_text, write_outputs  # lazy: as above
    from ..validation.setup import value  # lazy: as above
    from ..validation.simulate import simulate_rows  # lazy: as above

    names = [p.strip() for p in params.split(",") if p.strip()]
    for n in names:
        if n not in FIT_BOUNDS:
            raise InputError(f"params: unknown factor {n!r} (choose from {', '.join(FIT_BOUNDS)})")
    by = [c.strip() for c in cross.split(",")] if cross else []
    for c in by:
        if c not in ("model", "gpu", "tp"):
            raise InputError(f"cross_validate: unknown column {c!r} (choose from model, gpu, tp)")
    rows = read_measured(measured).rows
    cal0 = load_calibration(start)
    say = lambda m: click.echo(f"  {m}", err=True)  # noqa: E731
    with get_executor(jobs) as ex:
        res = fit(rows, cal0.eff, api_overhead_s=cal0.api_overhead_s, params=names, rounds=rounds,
                  max_stage_s=max_stage_s, executor=ex, progress=say)
        gpus = sorted({str(value(r, "gpu")) for r in rows})
        engines = sorted({f"{value(r, 'engine')} {value(r, 'engine_version')}" for r in rows})
        left_out = len({value(r, 'id') for r in rows}) - res.experiments_fitted
        info = {"fitted_on": f"{Path(measured).name}: {res.experiments_fitted} experiments, {res.rows_fitted} stages "
                             f"({left_out} experiments left out: overloaded stages or assumed prompt lengths); "
                             f"GPUs {', '.join(gpus)}; {', '.join(engines)}",
                "method": f"lbbench profile fit: coordinate descent over {', '.join(names)}, {rounds} rounds, "
                          "loss = mean |log(predicted / measured)| of mean E2E, TTFT and ITL per stage",
                "loss": round(res.loss, 5), "date": _dt.date.today().isoformat()}
        cal = Calibration(eff=res.eff, api_overhead_s=res.api_overhead_s, info=info)
        write_calibration(cal, out)
        click.echo(f"wrote {out}: " + ", ".join(f"{k} {v:.4g}" for k, v in res.params().items()))
        fitted = simulate_rows(rows, res.eff, api_overhead_s=res.api_overhead_s, executor=ex)
        click.echo(render_text(fitted, "Fitted rows (in-sample)"))
        if report_dir:
            write_outputs(fitted, Path(report_dir) / "fitted", "Fitted rows (in-sample)")
        for c in by:
            held = cross_validate(rows, res, by=c, rounds=max(rounds, 1), params=names, max_stage_s=max_stage_s,
                                  executor=ex, progress=say)
            click.echo("\n" + render_text(held, f"Held out by {c} (each group fitted without it)"))
            if report_dir:
                write_outputs(held, Path(report_dir) / f"held-out-{c}", f"Held out by {c}")
