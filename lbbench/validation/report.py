"""Predicted against measured, summarized: error tables by metric and by GPU, model and TP; text, Parquet, HTML.

The error of one (stage, metric) is ``predicted / measured - 1``; a table cell is the mean absolute percentage
error (MAPE) over the stages in it, with the signed mean (bias) and the count beside it. Experiments the simulator
could not build are listed with their reason and counted as not covered, never dropped.
"""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from ..reports.html import figure, page
from .metrics import METRICS

#: the headline metrics, in the order the tables show them
HEADLINE = ("e2e_mean_ms", "ttft_mean_ms", "itl_mean_ms", "e2e_p90_ms", "e2e_p99_ms", "ttft_p90_ms", "ttft_p99_ms",
            "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "e2e_p50_ms", "throughput_rps", "output_tok_s")


def covered(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(pl.col("not_covered").is_null() & pl.col("error_pct").is_not_null())


def not_covered(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(pl.col("not_covered").is_not_null()).select("id", "model", "gpu", "tp", "not_covered")


def mape_by(frame: pl.DataFrame, keys: Sequence[str] = ()) -> pl.DataFrame:
    """MAPE, bias and count per metric (columns) and ``keys`` (rows)."""
    d = covered(frame)
    group = [*keys, "metric"]
    agg = (d.group_by(group).agg(pl.col("error_pct").abs().mean().alias("mape"),
                                 pl.col("error_pct").mean().alias("bias"), pl.len().alias("n"))
           .sort(group))
    return agg


def headline_table(frame: pl.DataFrame, keys: Sequence[str] = ()) -> pl.DataFrame:
    """One row per group of ``keys`` (or one row), a column ``<metric>`` of "MAPE % (n)" for each metric present."""
    agg = mape_by(frame, keys)
    metrics = [m for m in HEADLINE if m in set(agg["metric"].to_list())]
    cells = agg.with_columns(
        pl.format("{}% ({})", pl.col("mape").round(1), pl.col("n")).alias("cell"))
    if keys:
        wide = cells.pivot(on="metric", index=list(keys), values="cell")
    else:
        wide = cells.with_columns(pl.lit("all").alias("rows")).pivot(on="metric", index="rows", values="cell")
    return wide.select([c for c in wide.columns if c not in metrics] + [m for m in metrics if m in wide.columns])


def stage_table(frame: pl.DataFrame, metrics: Sequence[str] = ("e2e_mean_ms", "ttft_mean_ms", "itl_mean_ms")
                ) -> pl.DataFrame:
    """One row per stage: measured, predicted and error for ``metrics``."""
    d = covered(frame).filter(pl.col("metric").is_in(list(metrics)))
    out = d.pivot(on="metric", index=["id", "stage", "model", "gpu", "tp"],
                  values=["measured", "predicted", "error_pct"])
    return out.sort("id", "stage")


def render_text(frame: pl.DataFrame, title: str = "Simulator against measured runs") -> str:
    """The tables as plain text (the CLI prints this)."""
    lines = [title, ""]
    cov = covered(frame)
    n_exp = frame["id"].n_unique()
    nc = not_covered(frame)
    lines.append(f"experiments: {n_exp}, stages simulated: {cov.select('id', 'stage').unique().height}, "
                 f"not covered: {nc.height}")
    walls = frame.group_by("id").agg(pl.col("sim_wall_s").max())["sim_wall_s"].drop_nulls()
    if walls.len():
        lines.append(f"simulation time per experiment: median {walls.median():.2f} s, max {walls.max():.2f} s, "
                     f"total {walls.sum():.1f} s (CPU seconds of the workers; wall time is less with --jobs)")
    with pl.Config(tbl_rows=200, tbl_cols=20, tbl_width_chars=200, fmt_str_lengths=60, tbl_hide_dataframe_shape=True,
                   tbl_formatting="ASCII_MARKDOWN", tbl_hide_column_data_types=True):
        lines += ["", "MAPE by metric (all rows), % (stages):", str(headline_table(frame))]
        for key in ("gpu", "model", "tp"):
            t = headline_table(frame, [key]).select([key, *[m for m in ("e2e_mean_ms", "ttft_mean_ms",
                                                                       "itl_mean_ms") if m in
                                                             headline_table(frame, [key]).columns]])
            lines += ["", f"MAPE by {key} (mean E2E, TTFT, ITL):", str(t)]
        st = stage_table(frame)
        if st.height:
            show = st.select("id", "stage", *[c for c in st.columns if c.startswith("error_pct")]).with_columns(
                pl.col(pl.Float64).round(1))
            lines += ["", "Error per stage, %:", str(show)]
        if nc.height:
            lines += ["", "Not covered:", str(nc)]
        notes = cov.filter(pl.col("note").is_not_null()).select("id", "note").unique().sort("id")
        if notes.height:
            lines += ["", "Notes:"] + [f"- {i}: {n}" for i, n in notes.iter_rows()]
    return "\n".join(lines)


def write_outputs(frame: pl.DataFrame, out_dir: str | Path, title: str = "Simulator against measured runs") -> list[Path]:
    """``fidelity.parquet`` (the long frame), ``fidelity.txt`` and ``fidelity.html`` (tables, and a predicted
    against measured plot per headline metric when matplotlib is installed)."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "fidelity.parquet", out / "fidelity.txt", out / "fidelity.html"]
    frame.write_parquet(paths[0])
    text = render_text(frame, title)
    paths[1].write_text(text + "\n")
    body = [f"<h1>{title}</h1>", f"<pre>{_escape(text)}</pre>"]
    try:
        figs = scatter_plots(frame)
    except ImportError:
        figs = []
        body.append("<p class=\"note\">matplotlib is not installed (pip install lbbench[plot]): no plots.</p>")
    body += [figure(png, caption) for caption, png in figs]
    paths[2].write_text(page(title, body))
    return paths


def _escape(s: str) -> str:
    return html.escape(s)


def scatter_plots(frame: pl.DataFrame) -> list[tuple[str, bytes]]:
    """One predicted-against-measured scatter (log-log, the y = x line and +-10 / 20 % bands) per metric."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib is the plot extra
    from matplotlib.figure import Figure  # lazy: as above

    d = covered(frame)
    out = []
    for metric in [m for m in METRICS if m in set(d["metric"].to_list())]:
        part = d.filter(pl.col("metric") == metric)
        fig = Figure(figsize=(5.2, 4.6))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        x, y = part["measured"].to_numpy(), part["predicted"].to_numpy()
        for model in sorted(set(part["model"].to_list())):
            m = (part["model"] == model).to_numpy()
            ax.scatter(x[m], y[m], s=18, label=model.split("/")[-1])
        lo, hi = float(min(x.min(), y.min())) * 0.8, float(max(x.max(), y.max())) * 1.25
        line = np.array([lo, hi])
        ax.plot(line, line, "k-", lw=0.8)
        for f, style in ((1.1, ":"), (1.2, "--")):
            ax.plot(line, line * f, "k" + style, lw=0.5)
            ax.plot(line, line / f, "k" + style, lw=0.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {metric}")
        ax.set_ylabel(f"simulated {metric}")
        mape = float(part["error_pct"].abs().mean())
        ax.set_title(f"{metric}: MAPE {mape:.1f} % over {part.height} stages", fontsize=9)
        ax.legend(fontsize=6, loc="upper left")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        out.append((f"{metric}: simulated against measured (lines: equal, +-10 %, +-20 %)", buf.getvalue()))
    return out
