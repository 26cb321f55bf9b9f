"""The nightly history's figures (matplotlib, Agg canvas): one per metric, each night a point.

Top panel: the metric per night, one line per router, the baseline's value dotted in the line's colour. Bottom
panel (gated metrics): the change against the baseline with the gate's interval — ``lbbench compare``'s own
numbers, ``History.rows`` — and the threshold a night must stay under; a night that failed the gate is shaded
red on both panels and its failing points are crossed.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from .compare import METRICS
from .history import LABELS, History
from .plots import Plot, figure_png


def metric_figure(history: History, metric: str) -> bytes:
    """One metric over the nights (see the module docstring)."""
    rows = history.metric_rows(metric)
    labels = [n.label for n in history.nights]
    x_of = {label: i for i, label in enumerate(labels)}
    gated = metric in METRICS
    fig = Figure(figsize=(max(7.5, 0.6 * len(labels) + 3), 6.4 if gated else 4.0))
    axes = fig.subplots(2 if gated else 1, 1, sharex=True, squeeze=False)[:, 0]
    failed = set(history.failed())
    for i, label in enumerate(labels):
        if label in failed:
            for ax in axes:
                ax.axvspan(i - 0.4, i + 0.4, color="tab:red", alpha=0.12, lw=0)
            axes[0].text(i, 0.98, "failed the gate", transform=axes[0].get_xaxis_transform(), ha="center",
                         va="top", fontsize="small", color="tab:red")
    groups = history.groups()
    width = 0.5 / max(1, len(groups))
    for k, group in enumerate(groups):
        g = rows.filter(pl.col("group") == group)
        if not g.height:
            continue
        x = np.array([x_of[n] for n in g["night"]], float)
        line, = axes[0].plot(x, g["value"].fill_null(np.nan).to_numpy(), marker="o", label=group)
        base = g["baseline"].drop_nulls()
        if base.len():
            axes[0].axhline(base[0], color=line.get_color(), ls=":", lw=1)
        bad = g["regression"].to_numpy()
        if bad.any():
            axes[0].scatter(x[bad], g["value"].to_numpy()[bad], marker="x", s=90, color="tab:red", zorder=3)
        if gated:
            dx = x + (k - (len(groups) - 1) / 2) * width  # routers side by side within a night
            change = g["change_pct"].to_numpy()
            err = np.vstack([change - g["ci_low_pct"].to_numpy(), g["ci_high_pct"].to_numpy() - change])
            axes[1].errorbar(dx, change, yerr=err, fmt="o", capsize=3, color=line.get_color())
            if bad.any():
                axes[1].scatter(dx[bad], change[bad], marker="x", s=90, color="tab:red", zorder=3)
    name = LABELS.get(metric, metric)
    axes[0].set_ylabel(name)
    axes[0].set_title(f"{name} by night" + ("" if gated else " (not gated)"))
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    if gated:
        worse = 1.0 if METRICS[metric].lower_is_better else -1.0
        axes[1].axhline(0, color="black", lw=0.8)
        axes[1].axhline(worse * history.max_regression_pct, color="tab:red", ls="--", lw=1,
                        label=f"gate: {history.max_regression_pct:g}% worse")
        axes[1].set_ylabel(f"change vs {history.baseline_label()} (%)")
        axes[1].grid(alpha=0.3)
        axes[1].legend(fontsize="small")
    axes[-1].set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize="small")
    return figure_png(fig)


def history_plots(history: History) -> Iterator[Plot]:
    """One figure per metric, in the history's order, for the HTML page's "history" section."""
    failed = history.failed()
    marked = (f"; failed the gate (shaded red, failing points crossed): {', '.join(failed)}" if failed
              else "; no night failed the gate")
    for m in history.metrics:
        if not history.metric_rows(m).height:
            continue
        what = LABELS.get(m, m)
        caption = (f"{what} per night and router; below, the change against the baseline with the gate's "
                   f"{history.max_regression_pct:g}% threshold and interval{marked}" if m in METRICS
                   else f"{what} per night and router (not gated)")
        yield Plot(f"history_{m}", "history", caption, metric_figure(history, m))
