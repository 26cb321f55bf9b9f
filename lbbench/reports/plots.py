"""Report plots as PNG bytes (matplotlib, Agg canvas; no pyplot global state).

matplotlib because it is the long-maintained default of the scientific Python stack,
renders headless to PNG with no browser or server, and is already an optional extra.

- ``cdf``: empirical CDF of a latency (E2E, TTFT) per router, all seeds pooled;
- ``latency_over_time``: mean latency per arrival-time bin, per router;
- ``instance_timeline``: per-instance running requests and KV usage over time, one column
  per router (first seed), from a ``timeline.parquet``;
- ``improvement_bars``: improvement over the baseline per router with its 95% interval;
- ``load_curves``: mean and p99 E2E and goodput against the arrival rate (a load sweep),
  one line per router (and instance scheduler, ...);
- ``sweep_plots``: a load sweep's three figures, per router: output tokens/s per instance against output
  tokens/s per user (one point per rate), goodput and p99 TTFT against the rate, saturated steps circled;
- ``report_plots``: every figure of a report, from its parts (``Report.figures`` passes them).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..metrics.summary import Slo, completed_expr, derive, summarize

_LABELS = {"e2e_s": "end-to-end latency", "ttft_s": "time to first token",
           "router_wait_s": "router wait"}
_MAX_POINTS = 2000


def figure_png(fig: Figure) -> bytes:
    """A figure as PNG bytes (100 dpi, tight bounding box)."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def group_label(row: dict, keys: Sequence[str]) -> str:
    extra = [f"{k}={row[k]}" for k in keys if k != "router"]
    return str(row["router"]) + (f" ({', '.join(extra)})" if extra else "")


def _groups(df: pl.DataFrame, keys: Sequence[str]):
    for gkey, g in df.partition_by(list(keys), as_dict=True, maintain_order=True).items():
        yield group_label(dict(zip(keys, gkey)), keys), g


def cdf(lf: pl.LazyFrame, keys: Sequence[str], metric: str = "e2e_s") -> bytes:
    """Empirical CDF of ``metric`` (seconds) per group, completed requests of all seeds."""
    df = derive(lf).filter(completed_expr()).select([*keys, metric]).collect()
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.add_subplot()
    for label, g in _groups(df, keys):
        v = np.sort(g[metric].drop_nulls().to_numpy())
        if len(v) == 0:
            continue
        p = np.arange(1, len(v) + 1) / len(v)
        if len(v) > _MAX_POINTS:
            pick = np.linspace(0, len(v) - 1, _MAX_POINTS).astype(int)
            v, p = v[pick], p[pick]
        ax.plot(v, p, label=label, drawstyle="steps-post")
    name = _LABELS.get(metric, metric)
    ax.set_title(f"CDF of {name} per router")
    ax.set_xlabel(f"{name} (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return figure_png(fig)


def latency_over_time(lf: pl.LazyFrame, keys: Sequence[str], metric: str = "e2e_s",
                      num_bins: int = 40) -> bytes:
    """Mean ``metric`` per arrival-time bin (all seeds pooled), one line per group."""
    df = derive(lf).filter(completed_expr()).select([*keys, "arrival_s", metric]).collect()
    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.add_subplot()
    if df.height:
        lo, hi = df["arrival_s"].min(), df["arrival_s"].max()
        edges = np.linspace(lo, hi if hi > lo else lo + 1.0, num_bins + 1)
        mids = (edges[:-1] + edges[1:]) / 2
        for label, g in _groups(df, keys):
            idx = np.clip(np.searchsorted(edges, g["arrival_s"].to_numpy(), side="right") - 1,
                          0, num_bins - 1)
            vals = g[metric].to_numpy()
            sums = np.bincount(idx, weights=vals, minlength=num_bins)
            counts = np.bincount(idx, minlength=num_bins)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
            ax.plot(mids, mean, marker=".", label=label)
    name = _LABELS.get(metric, metric)
    ax.set_title(f"Mean {name} over arrival time")
    ax.set_xlabel("arrival time (s)")
    ax.set_ylabel(f"mean {name} (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return figure_png(fig)


def instance_timeline(timeline: pl.LazyFrame, max_routers: int = 8) -> bytes | None:
    """Running requests and KV usage per instance over time: for each router its first seed
    and first variant (run, order, scheduler, chunked prefill), so lines never mix runs."""
    df = timeline.collect()
    need = {"router", "seed", "time_s", "instance", "num_running", "kv_usage"}
    if df.height == 0 or not need <= set(df.columns):
        return None
    routers = df["router"].unique(maintain_order=True).to_list()[:max_routers]
    fig = Figure(figsize=(3.6 * len(routers) + 1, 6.0))
    axes = fig.subplots(2, len(routers), squeeze=False, sharex="col", sharey="row")
    variant_cols = [c for c in ("run", "order", "instance_scheduler", "chunked_prefill", "profile")
                    if c in df.columns]
    for j, router in enumerate(routers):
        part = df.filter(pl.col("router") == router)
        seed = part["seed"].min()
        part = part.filter(pl.col("seed") == seed)
        first = part.row(0, named=True)
        for c in variant_cols:  # one variant per router: the first one present
            part = part.filter(pl.col(c).eq_missing(first[c]))
        part = part.sort("time_s")
        for inst, g in part.partition_by("instance", as_dict=True, maintain_order=True).items():
            t = g["time_s"].to_numpy()
            axes[0][j].step(t, g["num_running"].to_numpy(), where="post", label=f"instance {inst[0]}")
            axes[1][j].step(t, 100.0 * g["kv_usage"].to_numpy(), where="post",
                            label=f"instance {inst[0]}")
        axes[0][j].set_title(f"{router} (seed {seed})")
        axes[1][j].set_xlabel("time (s)")
        for ax in (axes[0][j], axes[1][j]):
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("running requests")
    axes[1][0].set_ylabel("KV cache usage (%)")
    axes[0][-1].legend(fontsize="small", loc="upper right")
    fig.suptitle("Per-instance load over time")
    return figure_png(fig)


def improvement_bars(main: pl.DataFrame, keys: Sequence[str], baseline: str = "round_robin") -> bytes:
    """Improvement over the baseline (%) per group, with 95% interval whiskers."""
    df = main.filter(pl.col("router") != baseline)
    fig = Figure(figsize=(max(5.0, 0.9 * df.height + 2), 4.5))
    ax = fig.add_subplot()
    labels = [group_label(r, keys) for r in df.iter_rows(named=True)]
    vals = df["improvement_pct"].fill_null(np.nan).to_numpy()
    lo = df["ci_low_pct"].fill_null(np.nan).to_numpy()
    hi = df["ci_high_pct"].fill_null(np.nan).to_numpy()
    err = np.vstack([np.nan_to_num(vals - lo), np.nan_to_num(hi - vals)])
    colors = ["tab:green" if v >= 0 else "tab:red" for v in np.nan_to_num(vals)]
    x = np.arange(len(labels))
    ax.bar(x, np.nan_to_num(vals), yerr=err, capsize=4, color=colors)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel(f"improvement over {baseline} (%)")
    ax.set_title(f"Mean E2E improvement over {baseline} (positive = faster)")
    ax.set_xlabel("router (bar: mean over seeds; whiskers: 95% bootstrap interval)")
    ax.grid(axis="y", alpha=0.3)
    return figure_png(fig)


def load_curves(lf: pl.LazyFrame, keys: Sequence[str], slo: Slo | None = None) -> bytes | None:
    """Mean E2E, p99 E2E and goodput (per seed, averaged) against ``rate_per_s``, one line
    per group of the other keys; None when the rows hold fewer than two rates."""
    if "rate_per_s" not in keys:
        return None
    s = summarize(lf, by=list(keys), slo=slo).sort("rate_per_s")
    if s["rate_per_s"].n_unique() < 2:
        return None
    others = [k for k in keys if k != "rate_per_s"]
    fig = Figure(figsize=(13.5, 4.2))
    axes = fig.subplots(1, 3)
    fig.subplots_adjust(wspace=0.35)
    panels = (("mean_e2e_s", "mean E2E (s)"), ("p99_e2e_s", "p99 E2E (s)"),
              ("goodput_per_s", "goodput (requests/s within SLO)" if slo else "goodput (completed requests/s)"))
    for gkey, g in s.partition_by(others, as_dict=True, maintain_order=True).items():
        label = group_label(dict(zip(others, gkey)), others)
        for ax, (col, _) in zip(axes, panels):
            ax.plot(g["rate_per_s"].to_numpy(), g[col].fill_null(np.nan).to_numpy(), marker="o", label=label)
    for ax, (_, name) in zip(axes, panels):
        ax.set_xlabel("arrival rate (requests/s)")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[2].legend(fontsize="small")
    fig.suptitle("Latency and goodput against load" + (f" (SLO: {slo.describe()})" if slo else ""))
    return figure_png(fig)


def sweep_points(lf: pl.LazyFrame, keys: Sequence[str], slo: Slo | None = None) -> pl.DataFrame | None:
    """One row per group of a load sweep (``keys`` holds ``rate_per_s``), averaged over seeds, sorted by rate:
    ``tokens_per_s_per_instance`` (output tokens/s of the fleet over its instances), ``tokens_per_s_per_user``
    (per completed request of two or more tokens, output tokens after the first over the time after it: the
    speed a user reads at), ``goodput_per_s``, ``p99_ttft_s`` and ``saturated``; None with fewer than two
    rates."""
    if "rate_per_s" not in keys:
        return None
    keys = list(keys)
    s = summarize(lf, by=keys, slo=slo)
    if s["rate_per_s"].n_unique() < 2:
        return None
    d = derive(lf)
    decode = pl.col("finish_s") - pl.col("first_token_s")
    user = (d.filter(completed_expr() & (pl.col("generated_tokens") > 1) & (decode > 0))
            .with_columns(((pl.col("generated_tokens") - 1) / decode).alias("_user"))
            .group_by([*keys, "seed"]).agg(pl.col("_user").mean())
            .group_by(keys).agg(pl.col("_user").mean().alias("tokens_per_s_per_user")))
    inst = d.group_by(keys).agg(pl.col("num_instances").first().cast(pl.Float64).alias("_n")) \
        if "num_instances" in d.collect_schema() else None
    out = s.lazy().join(user, on=keys, how="left", nulls_equal=True)
    if inst is not None:
        out = out.join(inst, on=keys, how="left", nulls_equal=True)
    else:
        out = out.with_columns(pl.lit(None, pl.Float64).alias("_n"))
    if "saturated" not in s.columns:
        out = out.with_columns(pl.lit(False).alias("saturated"))
    return (out.with_columns((pl.col("throughput_tokens_per_s") / pl.col("_n").fill_null(1.0))
                             .alias("tokens_per_s_per_instance"))
            .drop("_n").sort("rate_per_s", maintain_order=True).collect())


def _sweep_lines(points: pl.DataFrame, keys: Sequence[str]):
    others = [k for k in keys if k != "rate_per_s"]
    for gkey, g in points.partition_by(others, as_dict=True, maintain_order=True).items():
        yield group_label(dict(zip(others, gkey)), others), g.sort("rate_per_s")


def _mark_saturated(ax, x: np.ndarray, y: np.ndarray, saturated: np.ndarray, first: bool) -> None:
    if saturated.any():
        ax.scatter(x[saturated], y[saturated], s=140, facecolors="none", edgecolors="tab:red", linewidths=1.5,
                   zorder=3, label="saturated step" if first else None)


def sweep_figure(points: pl.DataFrame, keys: Sequence[str], kind: str, slo: Slo | None = None) -> bytes:
    """One figure of a load sweep, one line per router (and other keys): ``pareto`` (output tokens/s per
    instance against output tokens/s per user, each point a rate), ``goodput`` or ``p99_ttft`` against the
    rate. Saturated steps are circled in red."""
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    first = True
    first_label = None
    for label, g in _sweep_lines(points, keys):
        first_label = first_label or label
        rate = g["rate_per_s"].to_numpy()
        sat = g["saturated"].fill_null(False).to_numpy().astype(bool)
        if kind == "pareto":
            x = g["tokens_per_s_per_user"].fill_null(np.nan).to_numpy()
            y = g["tokens_per_s_per_instance"].fill_null(np.nan).to_numpy()
        else:
            x = rate
            y = g["goodput_per_s" if kind == "goodput" else "p99_ttft_s"].fill_null(np.nan).to_numpy()
        ax.plot(x, y, marker="o", label=label)
        if kind == "pareto" and label == first_label:  # the rates once, beside the first line
            for xi, yi, r in zip(x, y, rate):
                if np.isfinite(xi) and np.isfinite(yi):
                    ax.annotate(f"{r:g}/s", (xi, yi), textcoords="offset points", xytext=(4, 4),
                                fontsize="x-small")
        _mark_saturated(ax, x, y, sat, first)
        first = first and not sat.any()
    if kind == "pareto":
        ax.set_title("Throughput against interactivity (each point a rate)")
        ax.set_xlabel("output tokens/s per user (after the first token)")
        ax.set_ylabel("output tokens/s per instance")
    elif kind == "goodput":
        ax.set_title("Goodput against the arrival rate" + (f" (SLO: {slo.describe()})" if slo
                                                           else " (no SLO: every completed request counts)"))
        ax.set_xlabel("arrival rate (requests/s)")
        ax.set_ylabel("goodput (requests/s within SLO)" if slo else "goodput (completed requests/s)")
    else:
        ax.set_title("p99 time to first token against the arrival rate")
        ax.set_xlabel("arrival rate (requests/s)")
        ax.set_ylabel("p99 TTFT (s)")
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return figure_png(fig)


#: the sweep figures: file-name stem, kind, caption
SWEEP_FIGURES = (
    ("sweep_pareto", "pareto", "Output tokens/s per instance against output tokens/s per user, per router: one "
                               "point per rate (a Pareto-style front; up and right is better)"),
    ("sweep_goodput", "goodput", "Goodput against the arrival rate, per router"),
    ("sweep_p99_ttft", "p99_ttft", "p99 time to first token against the arrival rate, per router"),
)
#: what the goodput caption adds when the report has no SLO
NO_SLO_NOTE = ("no SLO was given (lbbench report --slo ttft=S,tbt=S,e2e=S): goodput counts every completed "
               "request")


def sweep_plots(lf: pl.LazyFrame, keys: Sequence[str], slo: Slo | None = None) -> Iterator[Plot]:
    """The three figures of a load sweep (nothing when the rows hold fewer than two rates)."""
    points = sweep_points(lf, keys, slo)
    if points is None:
        return
    for name, kind, caption in SWEEP_FIGURES:
        if kind == "goodput":
            caption += f" (SLO: {slo.describe()})" if slo else f"; {NO_SLO_NOTE}"
        if points["saturated"].any():
            caption += "; saturated steps circled in red"
        yield Plot(name, "sweep", caption, sweep_figure(points, keys, kind, slo))


@dataclass(frozen=True)
class Plot:
    """One rendered figure: a file-name stem, a caption and the PNG bytes."""

    name: str
    section: str
    caption: str
    png: bytes


#: Per-instance load figures (one per run) in one report.
MAX_TIMELINES = 6


def report_plots(requests: pl.LazyFrame, keys: list[str], baseline: str, main: pl.DataFrame | None,
                 slo: Slo | None, timelines: Sequence[tuple[str, pl.LazyFrame | None]]) -> Iterator[Plot]:
    """Every figure of a report, in page order (sections: improvement, latency, load).

    ``main`` is the report's main table (None: no improvement figure); ``timelines`` pairs each run's label
    with its per-instance timeline (``RunInfo.timeline()``; None: the run has none).
    """
    lf = requests
    if main is not None and main.filter(pl.col("router") != baseline).height:
        yield Plot("improvement", "improvement",
                   "Improvement over the baseline with 95% bootstrap intervals",
                   improvement_bars(main, keys, baseline))
    curves = load_curves(lf, keys, slo)
    if curves is not None:
        yield Plot("load_curves", "latency", "Mean and p99 E2E latency and goodput against the arrival rate",
                   curves)
    yield from sweep_plots(lf, keys, slo)
    yield Plot("e2e_cdf", "latency", "CDF of end-to-end latency", cdf(lf, keys, "e2e_s"))
    yield Plot("ttft_cdf", "latency", "CDF of time to first token", cdf(lf, keys, "ttft_s"))
    yield Plot("e2e_over_time", "latency", "Mean E2E latency over arrival time",
               latency_over_time(lf, keys))
    shown = 0
    for label, timeline in timelines:
        if timeline is None or shown >= MAX_TIMELINES:
            continue
        png = instance_timeline(timeline)
        if png is not None:
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)
            yield Plot(f"load_{stem}", "load",
                       f"Run {label}: running requests and KV cache usage per instance", png)
            shown += 1
