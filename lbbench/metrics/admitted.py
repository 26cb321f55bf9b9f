"""The admitted load of a run with flow control: how many requests each router's gateway shed, the load it
admitted, and whether the routers were compared at the same admitted load.

A request shed by flow control (``lbbench.admission``) is a record with ``http_status`` 429 (rejected on arrival)
or 503 (evicted from the queue) and an ``error`` starting ``SHED_PREFIX``. The summary then carries, per group:

- ``shed``: shed requests, summed over seeds;
- ``admitted_rate_per_s``: per seed, the requests not shed / (last arrival - first arrival); averaged over seeds
  (the offered rate is every request over the same span).

Both appear only when some request was shed, so a run without flow control keeps its table. Shed requests are
failed requests to every other statistic: goodput and SLO attainment count them as misses.
``admitted_load_line`` is the one line a run prints: the admitted load per router, and whether the routers were
compared at different admitted loads (more than ``SAME_LOAD`` apart), as a gateway that sheds more leaves its
router an easier load.
"""

from __future__ import annotations

import polars as pl

from ..admission import SHED_PREFIX
COLUMNS = ("shed", "admitted_rate_per_s")
#: admitted loads within this fraction of each other count as the same
SAME_LOAD = 0.01


def shed_expr() -> pl.Expr:
    """True for requests flow control shed."""
    return pl.col("error").fill_null("").str.starts_with(SHED_PREFIX)


def per_seed_exprs(schema: pl.Schema) -> list[pl.Expr]:
    """The per-seed counts (a derived requests frame: ``error`` and ``arrival_s`` are always there)."""
    if "error" not in schema:
        return []
    span = pl.col("arrival_s").max() - pl.col("arrival_s").min()
    shed = shed_expr()
    return [shed.sum().cast(pl.Int64).alias("shed"),
            pl.when(span > 0).then((~shed).sum() / span).alias("admitted_rate_per_s")]


def summary_exprs(seeds_schema: pl.Schema) -> list[pl.Expr]:
    if "shed" not in seeds_schema:
        return []
    return [pl.col("shed").sum(), pl.col("admitted_rate_per_s").mean()]


def drop_unless_shed(summary: pl.DataFrame) -> pl.DataFrame:
    """``summary`` without the admitted-load columns when nothing was shed."""
    if "shed" in summary.columns and not (summary.get_column("shed").fill_null(0) > 0).any():
        return summary.drop(*[c for c in COLUMNS if c in summary.columns])
    return summary


def admitted_load_line(summary: pl.DataFrame) -> str | None:
    """One line: shed requests and the admitted load per router, and whether the routers were compared at the
    same admitted load; None when nothing was shed."""
    if "shed" not in summary.columns:
        return None
    rows = [r for r in summary.to_dicts() if r.get("admitted_rate_per_s") is not None]
    if not rows:
        return None
    loads = ", ".join(f"{r['router']} {r['admitted_rate_per_s']:.2f} req/s ({r['shed']} shed)" for r in rows)
    lo = min(r["admitted_rate_per_s"] for r in rows)
    hi = max(r["admitted_rate_per_s"] for r in rows)
    if len(rows) < 2:
        verdict = ""
    elif hi - lo > SAME_LOAD * hi:
        verdict = (f" -- routers compared at DIFFERENT admitted loads ({lo:.2f} to {hi:.2f} req/s): latency "
                   "compares unequal loads; compare goodput or met SLO, which count shed requests as misses")
    else:
        verdict = f" -- routers compared at the same admitted load (within {SAME_LOAD:.0%})"
    return f"flow control: admitted load {loads}{verdict}"
