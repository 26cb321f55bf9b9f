"""The strongest baseline: the reference every router is measured against.

A router beyond the paper has to beat what operators already run, not round robin
alone: the best combination of a production router (``BASELINE_ROUTERS``) and an
instance-level scheduler (``fcfs``, ``least_work_left``, vLLM's ``priority``).
``against_best_baseline`` finds, per context (every group key that is neither the
router nor the instance scheduler, e.g. the arrival rate), the baseline combination
with the lowest mean E2E averaged over seeds, and adds to each group, paired by seed:

- ``best_baseline``: that combination, ``router`` or ``router/instance_scheduler``;
- ``vs_best_baseline_pct``: ``100 * (reference mean - mean) / reference mean`` (positive
  = faster than the reference), averaged over seeds;
- ``p99_vs_best_baseline_pct``: the same for the p99 E2E;
- ``goodput_vs_best_baseline_pct``: ``100 * (goodput - reference goodput) / reference
  goodput`` (positive = more requests/s within the SLO), over the seeds where the reference met
  the SLO at all.

Choosing the reference on the reported seeds favours the baseline, never the router
under test.
"""

from __future__ import annotations

from typing import Sequence

import polars as pl

from .summary import Frame, Slo, per_seed

BASELINE_ROUTERS: tuple[str, ...] = ("round_robin", "jsq", "least_requests", "power_of_two")
COMBO_KEYS: tuple[str, ...] = ("router", "instance_scheduler")
REFERENCE_COLUMNS: tuple[str, ...] = ("best_baseline", "vs_best_baseline_pct", "p99_vs_best_baseline_pct",
                                      "goodput_vs_best_baseline_pct")


def _label(combo: list[str]) -> pl.Expr:
    if len(combo) == 1:
        return pl.col("router")
    return pl.concat_str([pl.col("router"), pl.col(combo[1])], separator="/")


def against_best_baseline(df: Frame, by: Sequence[str], slo: Slo | None = None,
                          baselines: Sequence[str] = BASELINE_ROUTERS) -> pl.DataFrame:
    """One row per group of ``by`` (in first-seen order) with ``REFERENCE_COLUMNS``;
    the reference columns are null where a context has no baseline rows."""
    by = list(by) if "router" in by else ["router", *by]
    combo = [k for k in COMBO_KEYS if k in by]
    context = [k for k in by if k not in combo]
    seeds = per_seed(df, by, slo).select([*by, "seed", "mean_e2e_s", "p99_e2e_s", "goodput_per_s"]).collect()
    base = seeds.filter(pl.col("router").is_in(list(baselines)))
    if base.height == 0:
        out = seeds.select(by).unique(maintain_order=True)
        return out.with_columns(pl.lit(None, pl.String).alias("best_baseline"),
                                *[pl.lit(None, pl.Float64).alias(c) for c in REFERENCE_COLUMNS[1:]])
    means = base.group_by(by, maintain_order=True).agg(pl.col("mean_e2e_s").mean().alias("_m"))
    best = (means.sort("_m").group_by(context or pl.lit(0), maintain_order=True).first()
            if context else means.sort("_m").head(1))
    best = best.select([*by]).with_columns(_label(combo).alias("best_baseline"))
    ref = (base.join(best, on=by, how="inner", nulls_equal=True)
           .select([*context, "seed", "best_baseline", pl.col("mean_e2e_s").alias("_ref_mean"),
                    pl.col("p99_e2e_s").alias("_ref_p99"), pl.col("goodput_per_s").alias("_ref_good")]))
    joined = (seeds.join(ref, on=[*context, "seed"], how="left", nulls_equal=True, maintain_order="left")
              if context else seeds.join(ref, on="seed", how="left", maintain_order="left"))
    return (joined.with_columns(
                _gain=100.0 * (pl.col("_ref_mean") - pl.col("mean_e2e_s")) / pl.col("_ref_mean"),
                _p99=100.0 * (pl.col("_ref_p99") - pl.col("p99_e2e_s")) / pl.col("_ref_p99"),
                _good=pl.when(pl.col("_ref_good") > 0)  # undefined (null) where the reference met nothing
                .then(100.0 * (pl.col("goodput_per_s") - pl.col("_ref_good")) / pl.col("_ref_good")))
            .group_by(by, maintain_order=True)
            .agg(pl.col("best_baseline").first(), pl.col("_gain").mean().alias("vs_best_baseline_pct"),
                 pl.col("_p99").mean().alias("p99_vs_best_baseline_pct"),
                 pl.col("_good").mean().alias("goodput_vs_best_baseline_pct")))


def with_reference(summary: pl.DataFrame, df: Frame, by: Sequence[str], slo: Slo | None = None,
                   baselines: Sequence[str] = BASELINE_ROUTERS) -> pl.DataFrame:
    """``summary`` (one row per group of ``by``) with ``REFERENCE_COLUMNS`` appended."""
    by = list(by) if "router" in by else ["router", *by]
    ref = against_best_baseline(df, by, slo, baselines)
    return summary.join(ref, on=by, how="left", nulls_equal=True, maintain_order="left")
