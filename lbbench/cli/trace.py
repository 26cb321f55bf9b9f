"""``lbbench trace``: inspect and convert LLM inference traces.

``trace_transform_options`` is the set of trace flags shared with
``lbbench run --trace``: the run command adds its own ``--rate`` and
``--requests`` and passes them to ``load_trace_from_options``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console
from rich.table import Table

from ..core import Request
from ..experiment.config import RunConfig
from ..experiment.workload import build_requests
from ..profiles import load_profile
from ..workloads.synthetic_trace import open_loop_spec, write_workload_trace
from ..workloads.errors import WorkloadError
from ..workloads.trace_formats import FORMAT_NAMES, parse_mapping
from ..workloads.trace_stats import inspect_trace
from ..workloads.trace_transform import PROMPT_OVERFLOW_MODES, parse_window, transform_trace
from ..workloads.traces import load_trace_requests, read_trace, write_canonical
from .flags import user_message

TRACE_READ_OPTIONS = ("trace_format", "mapping", "skip_bad_rows")
TRACE_TRANSFORM_OPTIONS = ("time_scale", "window", "max_prompt_tokens", "prompt_overflow")
TRACE_OPTION_NAMES = TRACE_READ_OPTIONS + TRACE_TRANSFORM_OPTIONS


def _parsed(parse: Callable[[str], Any], flag: str) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    """A click callback running ``parse`` and turning its WorkloadError into a flag error."""
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            return parse(value)
        except WorkloadError as exc:
            raise click.BadParameter(str(exc).removeprefix(f"{flag.lstrip('-').replace('-', '_')}: "), ctx, param) from None
    return callback


_mapping_cb = _parsed(parse_mapping, "--mapping")
_window_cb = _parsed(parse_window, "--window")


def trace_transform_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the shared trace flags (keyword names in ``TRACE_OPTION_NAMES``)."""
    options = [
        click.option("--trace-format", type=click.Choice(FORMAT_NAMES), default=None,
                     help="Trace format; detected from the header when omitted."),
        click.option("--mapping", callback=_mapping_cb, default=None, metavar="KEY=COL,...",
                     help="Columns of a generic trace: arrival=COL,prompt=COL,output=COL[,task=COL]"
                          "[,hashes=COL][,failed=COL][,unit=s|ms|us|ns|datetime]; overrides a detected "
                          "format's columns."),
        click.option("--skip-bad-rows", is_flag=True, default=False,
                     help="Skip and count malformed rows instead of stopping at the first."),
        click.option("--time-scale", type=float, default=None,
                     help="Multiply every arrival time by this (2 = half the rate)."),
        click.option("--window", callback=_window_cb, default=None, metavar="START:END",
                     help="Keep arrivals in [START, END) seconds of the trace (either side may be empty)."),
        click.option("--max-prompt-tokens", type=click.IntRange(min=1), default=None,
                     help="Longest prompt to replay; see --prompt-overflow."),
        click.option("--prompt-overflow", type=click.Choice(PROMPT_OVERFLOW_MODES), default="filter",
                     show_default=True, help="Longer prompts: drop the request, or truncate the prompt."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def split_trace_options(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pop the shared trace flags from a command's kwargs: (read kwargs, transform kwargs)."""
    read = {k: kwargs.pop(k) for k in TRACE_READ_OPTIONS if k in kwargs}
    read = {"fmt": read.get("trace_format"), "mapping": read.get("mapping"),
            "skip_bad_rows": bool(read.get("skip_bad_rows", False))}
    transform = {k: kwargs.pop(k) for k in TRACE_TRANSFORM_OPTIONS if k in kwargs}
    transform.setdefault("prompt_overflow", "filter")
    return read, transform


def trace_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the shared trace flags from a command's kwargs, as one dict of read and transform options."""
    read, transform = split_trace_options(kwargs)
    return {**read, **transform}


def load_trace_from_options(path: str | Path, options: dict[str, Any], rate: float | None = None,
                            requests: int | None = None) -> list[Request]:
    """Requests of a trace given the shared flags (as ``split_trace_options`` leaves
    them, or the raw kwargs) plus run's ``--rate`` / ``--requests``."""
    opts = dict(options)
    if "fmt" in opts:
        read, transform = {k: opts.pop(k) for k in ("fmt", "mapping", "skip_bad_rows")}, opts
    else:
        read, transform = split_trace_options(opts)
    return load_trace_requests(path, **read, **transform, rate=rate, requests=requests)


@click.group("trace")
def trace() -> None:
    """Inspect and convert LLM inference traces (Azure, BurstGPT, Mooncake, canonical, mapped)."""


@trace.command("inspect")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "out_format", type=click.Choice(["table", "json"]), default="table", show_default=True)
@trace_transform_options
@click.option("--rate", type=float, default=None, help="Rescale arrivals to this mean rate (requests/s).")
@click.option("--requests", type=click.IntRange(min=1), default=None, help="Keep the first N requests.")
def inspect_cmd(file: str, out_format: str, rate: float | None, requests: int | None, **kwargs: Any) -> None:
    """Counts, span, rate and prompt/output length statistics of FILE.

    Without transform flags it describes the file as it is (failed rows
    included and counted); with them, the trace that would be replayed.
    """
    read, transform = split_trace_options(kwargs)
    transform.update(rate=rate, requests=requests)
    tf = read_trace(file, **read)  # a bad file or flag: a WorkloadError, the group's one line
    if any(v is not None for k, v in transform.items() if k != "prompt_overflow"):
        tf = transform_trace(tf, **transform, drop_failed=False)
    stats = inspect_trace(tf)
    if out_format == "json":
        click.echo(json.dumps(stats))
    else:
        _print_table(stats)


@trace.command("convert")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False, writable=True))
@trace_transform_options
@click.option("--rate", type=float, default=None, help="Rescale arrivals to this mean rate (requests/s).")
@click.option("--requests", type=click.IntRange(min=1), default=None, help="Keep the first N requests.")
@click.option("--keep-failed", is_flag=True, default=False, help="Keep failed rows (dropped by default).")
def convert_cmd(file: str, out: str, rate: float | None, requests: int | None, keep_failed: bool,
                **kwargs: Any) -> None:
    """Write FILE as a canonical Parquet trace OUT (after the transforms)."""
    read, transform = split_trace_options(kwargs)
    tf = transform_trace(read_trace(file, **read), **transform, rate=rate, requests=requests,
                         drop_failed=not keep_failed)
    write_canonical(tf, out)
    skipped = f", {tf.skipped_rows} bad rows skipped" if tf.skipped_rows else ""
    click.echo(f"wrote {len(tf)} requests ({tf.format} trace) to {out}{skipped}")


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}"


def _print_table(stats: dict[str, Any]) -> None:
    console = Console()
    rate = stats["rate_per_s"]
    console.print(f"[bold]{stats.get('file', '')}[/bold] ({stats.get('format', '?')}): "
                  f"{stats['rows']:,} rows, span {stats['span_s']:,.1f} s, "
                  f"rate {_fmt(rate, 2)} req/s, failed {stats['failed_rows']:,}, "
                  f"skipped {stats.get('skipped_rows', 0):,}")
    table = Table(title=None)
    table.add_column("tokens")
    for col in ("mean", "min", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="right")
    for name in ("prompt_tokens", "output_tokens"):
        table.add_row(name.split("_")[0], *(_fmt(stats[f"{name}_{c}"]) for c in
                                            ("mean", "min", "p50", "p90", "p99", "max")))
    console.print(table)
    if "tasks" in stats:
        console.print("tasks: " + ", ".join(f"{k} {v:,}" for k, v in list(stats["tasks"].items())[:10]))
    if "prefix_blocks" in stats:
        share = stats["prefix_blocks_repeated_share"]
        console.print(f"prefix blocks: {stats['prefix_blocks']:,}, repeated {_fmt(100 * share if share is not None else None)} %")


@trace.command("synth")
@click.argument("workload")
@click.argument("out", type=click.Path(dir_okay=False, writable=True))
@click.option("--rate", type=float, default=20.0, show_default=True, help="Offered request rate (requests/s).")
@click.option("--requests", type=click.IntRange(min=1), default=2000, show_default=True, help="Requests to write.")
@click.option("--seed", type=int, default=0, show_default=True, help="The workload's seed (a run's --seed).")
@click.option("--burstiness", type=float, default=1.0, show_default=True,
              help="CV of the inter-arrival gaps (1 = Poisson).")
@click.option("--profile", default="llama3.1-8b-a100", show_default=True,
              help="Profile whose max_model_len bounds contexts (and whose unloaded latencies plan agent calls).")
def synth_cmd(workload: str, out: str, rate: float, requests: int, seed: int, burstiness: float,
              profile: str) -> None:
    """Write the synthetic WORKLOAD (a --workload spec of lbbench run) to OUT as a canonical Parquet trace.

    An agentic workload is written open loop (every call at its planned time); closed-loop sessions are refused.
    `lbbench run --trace OUT` then replays the same requests.
    """
    spec = open_loop_spec(workload)  # bad input raises InputError: one line and exit 2 (the CLI group's handler)
    prof = load_profile(profile)
    reqs = build_requests(RunConfig(workload=spec, rate_per_s=rate, requests=requests, burstiness=burstiness),
                          prof, seed, None)
    tf = write_workload_trace(reqs, spec, out)
    blocks = f", prefix hashes of {tf.block_tokens} tokens" if tf.block_tokens else ""
    click.echo(f"wrote {len(tf)} requests of {spec} (seed {seed}) to {out}{blocks}")
