"""``lbbench measured``: import raw benchmark results into the measured-runs schema, and check such a file.

``lbbench measured import KIND PATH... --out FILE.csv`` runs the importer of KIND (``auto``: told apart by each
path's shape) and writes the rows; ``lbbench measured check FILE.csv`` validates a file and prints the
physical-bound flags (``lbbench.measured.checks``). Bad input ends with one line naming the file, row and column,
and exit 2.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..measured import read_measured, write_measured
from ..measured.checks import check_rows
from ..measured.importers import KINDS, import_measured
from ..measured.model_facts import ModelFacts

_MODEL_CONFIGS = click.option(
    "--model-configs", "model_dirs", multiple=True, type=click.Path(path_type=Path, file_okay=False),
    help="Directory of Hugging Face config.json files (NAME.json or NAME/config.json) for models lbbench does not "
         "ship; repeatable. Used for the weight dtype, KV bytes and the physical bounds.")


@click.group("measured")
def measured() -> None:
    """Measured GPU runs as data: import raw results into the measured-runs schema, check a measured-runs file."""


@measured.command("import")
@click.argument("kind", type=click.Choice(["auto", *KINDS]), metavar="KIND")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="Measured-runs file to write: CSV, or Parquet for a .parquet name.")
@click.option("--set", "context", multiple=True, metavar="COLUMN=VALUE",
              help="A value the raw files do not say (gpu=h100, engine_version=0.15.1), applied to every row; it "
                   "replaces a value read from the files. Repeatable.")
@_MODEL_CONFIGS
@click.option("--strict", is_flag=True,
              help="Stop (exit 2) at the first stage that cannot be imported, instead of reporting each and "
                   "writing the others.")
def import_cmd(kind: str, paths: tuple[Path, ...], out: Path, context: tuple[str, ...],
               model_dirs: tuple[Path, ...], strict: bool) -> None:
    """Import raw results into measured-runs rows.

    KIND is auto or one of: inference-perf (experiment folders), inference-sim-table, mlperf (loadgen scenario
    folders), vllm-bench (--save-result JSON), guidellm (report JSON), aiperf (profile export JSON or CSV),
    lbbench-run (a live run directory). Each note says what was derived and how; each stage that cannot be
    expressed in the schema is reported on one line.
    """
    report = import_measured(kind, paths, list(context), model_dirs)
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    if report.problems and (strict or not report.rows):
        raise report.problems[0]
    for problem in report.problems:
        click.echo(f"not imported: {problem}", err=True)
    write_measured(report.rows, out)
    skipped = f"; {len(report.problems)} stages not imported" if report.problems else ""
    click.echo(f"wrote {len(report.rows)} rows to {out} ({', '.join(dict.fromkeys(report.kinds))}){skipped}")


@measured.command("check")
@click.argument("path", type=click.Path(path_type=Path))
@_MODEL_CONFIGS
@click.option("--keep-going", is_flag=True,
              help="List every bad row (one line each) before exiting 2, instead of stopping at the first.")
def check_cmd(path: Path, model_dirs: tuple[Path, ...], keep_going: bool) -> None:
    """Validate a measured-runs file and flag values that break a physical bound.

    Exit 2 when the file or a row is invalid; flags (a mean TPOT below one read of the weights per step, a TTFT
    below one prefill at peak FLOP/s, a throughput above the offered rate, ...) are printed, one line each.
    """
    table = read_measured(path, strict=not keep_going)
    if table.problems:
        for problem in table.problems[:-1]:
            click.echo(f"Error: {problem}", err=True)
        raise table.problems[-1]
    report = check_rows(table.rows, facts=ModelFacts(tuple(model_dirs)), path=str(path), numbers=table.numbers)
    for f in report.flags:
        click.echo(f"flag: {f.line()}")
    for f in report.not_checked:
        click.echo(f"not checked: {f.line()}")
    flagged = len({f.where for f in report.flags})
    click.echo(f"{path}: {len(table.rows)} rows valid; {len(report.flags)} flags on {flagged} rows; "
               f"{len(report.not_checked)} rows not checked against the model's bounds")
