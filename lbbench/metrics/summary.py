"""Per-router summary of a run: the numbers `lbbench run` prints and reports build on.

``derive`` adds the per-request latencies that ``RequestRecord`` leaves to reports;
``summarize`` reduces many requests (many routers x many seeds) to one row per group.

Definitions (all over *completed* requests: ``error`` is null and ``finish_s`` is set):

- Latencies are relative to arrival: ``router_wait_s = dispatch - arrival``,
  ``ttft_s = first_token - arrival``, ``e2e_s = finish - arrival``; for live runs
  ``dispatch_lag_s = actual_send - planned_send``.
- Every statistic is first computed **per seed** and then averaged over seeds (seeds are
  paired: every router sees the same arrivals for a seed). ``*_std_s`` is the standard
  deviation over seeds of the per-seed mean (0 for a single seed).
- ``p50/p90/p99_e2e_s``, ``p99_ttft_s``: percentiles over the seed's requests
  (linear interpolation), averaged over seeds.
- ``mean_tbt_s``: mean over requests of each request's mean time between tokens
  (``tbt_mean_s``); ``p99_tbt_s``: the 99th percentile over requests of each request's own
  p99 time between tokens (``tbt_p99_s``); ``max_tbt_s``: the largest gap seen in any seed.
- ``improvement_vs_<baseline>_pct``: paired by seed and by every other group key,
  ``100 * (baseline_mean - mean) / baseline_mean`` averaged over seeds (positive = faster
  than the baseline); null when the frame has no baseline rows for that pairing.
  ``improvement_vs_<baseline>_s`` is the same difference in seconds.
- ``preemptions``: per seed, the sum of ``num_preemptions``; averaged over seeds.
- ``throughput_tokens_per_s``: per seed, generated tokens of completed requests divided by
  (last finish - first arrival); averaged over seeds.
- ``completed`` / ``failed``: request counts summed over all seeds.
- ``router_wait_max_s``: the longest wait at the router of any request in any seed.
- ``makespan_s``: per seed, last finish - first arrival; averaged over seeds.
- ``slo_attainment``: per seed, the share of *all* requests (failed ones count as misses)
  that completed within every limit of the ``Slo`` (with no ``Slo``, every completed
  request counts); averaged over seeds. ``goodput_per_s``: per seed, those requests
  divided by the makespan; averaged over seeds. TBT limits apply to each request's mean
  time between tokens (its time per output token); a request with one token meets any.
- ``prefix_cache_hit_rate``: per seed, prompt tokens served from the prefix cache at first
  admission / prompt tokens, over completed requests; averaged over seeds. Only when some
  request carries ``cached_prompt_tokens`` (null in groups where caching was off).
- Live runs only (null when no request carries an ``actual_send_s``):
  ``dispatch_lag_p50_s`` / ``dispatch_lag_p99_s`` over sent requests, ``achieved_rate_per_s``
  = sent requests / (last send - first send), ``requested_rate_per_s`` = rows / (last
  arrival - first arrival).
- ``intended_prefix_hit_rate`` and ``prefix_hit_check``: only when the workload intends prefix reuse or names
  prefix hashes (``lbbench.metrics.prefix_check``).
- ``shed`` and ``admitted_rate_per_s``: only when flow control shed some request (``lbbench.metrics.admitted``).
- ``saturated``: only when some group saturated (``lbbench.live.saturation``: its backlog kept growing faster
  than the threshold over a whole window; a live step then stopped sending): true when any seed of the group did.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import polars as pl

from ..errors import InputError
from . import admitted, prefix_check

Frame = pl.DataFrame | pl.LazyFrame

#: Columns ``summarize`` always emits after the group keys, in this order.
METRIC_COLUMNS: tuple[str, ...] = (
    "seeds", "mean_e2e_s", "mean_e2e_std_s", "improvement_vs_round_robin_pct",
    "improvement_vs_round_robin_s", "p50_e2e_s", "p90_e2e_s", "p99_e2e_s", "mean_ttft_s",
    "p99_ttft_s", "mean_tbt_s", "p99_tbt_s", "max_tbt_s", "mean_router_wait_s", "preemptions",
    "throughput_tokens_per_s", "completed", "failed", "dispatch_lag_p50_s", "dispatch_lag_p99_s",
    "achieved_rate_per_s", "requested_rate_per_s", "router_wait_max_s", "makespan_s",
    "goodput_per_s", "slo_attainment",
)

_FLOAT_COLS = ("arrival_s", "dispatch_s", "first_token_s", "finish_s", "tbt_mean_s", "tbt_p99_s",
               "tbt_max_s", "planned_send_s", "actual_send_s")
_REQUIRED = ("router", "seed", "arrival_s", "dispatch_s", "first_token_s", "finish_s",
             "generated_tokens")


class SummaryError(InputError):
    """The requests frame lacks what a summary needs (message names the column)."""


@dataclass(frozen=True)
class Slo:
    """Latency limits (seconds) for goodput; None means no limit on that metric.

    ``tbt_s`` applies to each request's mean time between tokens.
    """

    ttft_s: float | None = None
    tbt_s: float | None = None
    e2e_s: float | None = None

    def describe(self) -> str:
        parts = [f"{n} <= {v:g} s" for n, v in (("TTFT", self.ttft_s), ("TBT", self.tbt_s),
                                                ("E2E", self.e2e_s)) if v is not None]
        return ", ".join(parts) or "no limits"


def slo_met_expr(slo: Slo | None) -> pl.Expr:
    """True for requests (of a ``derive``d frame) that completed within every limit."""
    ok = completed_expr()
    if slo is None:
        return ok
    for col, lim in (("ttft_s", slo.ttft_s), ("tbt_mean_s", slo.tbt_s), ("e2e_s", slo.e2e_s)):
        if lim is not None:
            missing = 0.0 if col == "tbt_mean_s" else float("inf")  # one token: no gap to judge
            ok = ok & (pl.col(col).fill_null(missing) <= lim)
    return ok


def improvement_pct_col(baseline: str = "round_robin") -> str:
    return f"improvement_vs_{baseline}_pct"


def improvement_s_col(baseline: str = "round_robin") -> str:
    return f"improvement_vs_{baseline}_s"


def _lazy(df: Frame) -> pl.LazyFrame:
    return df.lazy() if isinstance(df, pl.DataFrame) else df


def derive(df: Frame) -> pl.LazyFrame:
    """Add ``router_wait_s``, ``ttft_s``, ``e2e_s`` and ``dispatch_lag_s``.

    Optional record columns that are missing (or all-null, so typed ``Null``) are
    added/cast as Float64 so later arithmetic is well typed.
    """
    lf = _lazy(df)
    schema = lf.collect_schema()
    casts = []
    for c in _FLOAT_COLS:
        if c in schema:
            casts.append(pl.col(c).cast(pl.Float64))
        else:
            casts.append(pl.lit(None, dtype=pl.Float64).alias(c))
    for c in ("num_preemptions", "generated_tokens"):
        casts.append(pl.col(c).cast(pl.Int64) if c in schema else pl.lit(None, pl.Int64).alias(c))
    if "error" not in schema:
        casts.append(pl.lit(None, pl.String).alias("error"))
    return lf.with_columns(casts).with_columns(
        router_wait_s=pl.col("dispatch_s") - pl.col("arrival_s"),
        ttft_s=pl.col("first_token_s") - pl.col("arrival_s"),
        e2e_s=pl.col("finish_s") - pl.col("arrival_s"),
        dispatch_lag_s=pl.col("actual_send_s") - pl.col("planned_send_s"),
    )


def completed_expr() -> pl.Expr:
    """True for requests that finished without error."""
    return pl.col("error").is_null() & pl.col("finish_s").is_not_null()


def _check(lf: pl.LazyFrame, by: Sequence[str]) -> None:
    schema = lf.collect_schema()
    missing = [c for c in (*by, *_REQUIRED) if c not in schema]
    if missing:
        raise SummaryError(f"requests table lacks column(s) {', '.join(missing)} "
                           f"(has: {', '.join(schema.names())})")


def per_seed(df: Frame, by: Sequence[str] = ("router",), slo: Slo | None = None) -> pl.LazyFrame:
    """One row per (group keys, seed) with the per-seed statistics ``summarize`` averages."""
    by = list(by)
    lf = _lazy(df)
    _check(lf, by)
    lf = derive(lf)
    ok = completed_expr()
    sent = pl.col("actual_send_s").is_not_null()
    live = sent.any()

    def c(name: str) -> pl.Expr:
        return pl.col(name).filter(ok)

    send_span = pl.col("actual_send_s").max() - pl.col("actual_send_s").min()
    arrival_span = pl.col("arrival_s").max() - pl.col("arrival_s").min()
    span = c("finish_s").max() - pl.col("arrival_s").min()
    met = slo_met_expr(slo)
    extra = []
    if "cached_prompt_tokens" in lf.collect_schema():
        cached = ok & pl.col("cached_prompt_tokens").is_not_null()
        extra.append(pl.when(cached.any()).then(
            pl.col("cached_prompt_tokens").filter(cached).sum()
            / pl.col("prompt_tokens").filter(cached).sum()).cast(pl.Float64).alias("prefix_cache_hit_rate"))
    if "saturated" in lf.collect_schema():
        extra.append(pl.col("saturated").fill_null(False).any().alias("saturated"))
    extra += prefix_check.per_seed_exprs(lf.collect_schema())
    extra += admitted.per_seed_exprs(lf.collect_schema())
    return (
        lf.group_by([*by, "seed"], maintain_order=True)
        .agg(*extra,
            mean_e2e_s=c("e2e_s").mean(),
            p50_e2e_s=c("e2e_s").quantile(0.5, "linear"),
            p90_e2e_s=c("e2e_s").quantile(0.9, "linear"),
            p99_e2e_s=c("e2e_s").quantile(0.99, "linear"),
            mean_ttft_s=c("ttft_s").mean(),
            p99_ttft_s=c("ttft_s").quantile(0.99, "linear"),
            mean_tbt_s=c("tbt_mean_s").mean(),
            p99_tbt_s=c("tbt_p99_s").quantile(0.99, "linear"),
            max_tbt_s=c("tbt_max_s").max(),
            mean_router_wait_s=c("router_wait_s").mean(),
            preemptions=c("num_preemptions").sum().cast(pl.Float64),
            throughput_tokens_per_s=pl.when(span > 0).then(c("generated_tokens").sum() / span),
            completed=ok.sum().cast(pl.Int64),
            failed=(~ok).sum().cast(pl.Int64),
            dispatch_lag_p50_s=pl.col("dispatch_lag_s").filter(sent).quantile(0.5, "linear"),
            dispatch_lag_p99_s=pl.col("dispatch_lag_s").filter(sent).quantile(0.99, "linear"),
            achieved_rate_per_s=pl.when(live & (send_span > 0)).then(sent.sum() / send_span),
            requested_rate_per_s=pl.when(live & (arrival_span > 0)).then(pl.len() / arrival_span),
            router_wait_max_s=pl.col("router_wait_s").max(),
            makespan_s=span,
            goodput_per_s=pl.when(span > 0).then(met.sum() / span),
            slo_attainment=met.mean(),
        )
    )


def _paired(seeds: pl.LazyFrame, by: list[str], baseline: str) -> pl.LazyFrame:
    """Per (group, seed) improvement over the baseline router of the same seed/other keys."""
    others = [k for k in by if k != "router"]
    base = (seeds.filter(pl.col("router") == baseline)
            .select([*others, "seed", pl.col("mean_e2e_s").alias("_base_e2e_s")]))
    return (seeds.join(base, on=[*others, "seed"], how="left", nulls_equal=True,
                       maintain_order="left")
            .with_columns(
                _imp_s=pl.col("_base_e2e_s") - pl.col("mean_e2e_s"),
                _imp_pct=100.0 * (pl.col("_base_e2e_s") - pl.col("mean_e2e_s")) / pl.col("_base_e2e_s"),
            ))


def summarize(df: Frame, by: Sequence[str] = ("router",), baseline: str = "round_robin",
              slo: Slo | None = None) -> pl.DataFrame:
    """One row per group: keys of ``by``, then ``METRIC_COLUMNS`` (see module docstring).

    Groups keep the order in which they first appear in ``df``. When ``baseline`` is not
    ``round_robin`` the two improvement columns are named after it.
    """
    by = list(by)
    if "router" not in by:
        by = ["router", *by]
    seeds = _paired(per_seed(df, by, slo), by, baseline)
    extra = [c for c in ("prefix_cache_hit_rate",) if c in seeds.collect_schema()]
    marks = [c for c in ("saturated",) if c in seeds.collect_schema()]
    mean_cols = ["p50_e2e_s", "p90_e2e_s", "p99_e2e_s", "mean_ttft_s", "p99_ttft_s", "mean_tbt_s",
                 "p99_tbt_s", "mean_router_wait_s", "preemptions", "throughput_tokens_per_s",
                 "dispatch_lag_p50_s", "dispatch_lag_p99_s", "achieved_rate_per_s",
                 "requested_rate_per_s", "makespan_s", "goodput_per_s", "slo_attainment"]
    out = (
        seeds.group_by(by, maintain_order=True)
        .agg(
            seeds=pl.col("seed").n_unique().cast(pl.Int64),
            mean_e2e_s=pl.col("mean_e2e_s").mean(),
            mean_e2e_std_s=pl.when(pl.len() > 1).then(pl.col("mean_e2e_s").std(ddof=1))
            .otherwise(0.0),
            improvement_vs_round_robin_pct=pl.col("_imp_pct").mean(),
            improvement_vs_round_robin_s=pl.col("_imp_s").mean(),
            max_tbt_s=pl.col("max_tbt_s").max(),
            router_wait_max_s=pl.col("router_wait_max_s").max(),
            completed=pl.col("completed").sum(),
            failed=pl.col("failed").sum(),
            *[pl.col(m).mean() for m in (*mean_cols, *extra)],
            *[pl.col(m).any() for m in marks],
            *prefix_check.summary_exprs(seeds.collect_schema()),
            *admitted.summary_exprs(seeds.collect_schema()),
        )
        .select([*by, *METRIC_COLUMNS, *extra, *marks,
                 *[c for c in prefix_check.COLUMNS if c in seeds.collect_schema()],
                 *[c for c in admitted.COLUMNS if c in seeds.collect_schema()]])
        .collect()
    )
    if marks and not out.get_column("saturated").any():
        out = out.drop("saturated")  # no step saturated: the table stays as it was
    if extra and out.get_column("prefix_cache_hit_rate").null_count() == out.height:
        out = out.drop("prefix_cache_hit_rate")  # caching was off everywhere: the table stays as it was
    out = prefix_check.add_check(out)
    out = admitted.drop_unless_shed(out)
    if baseline != "round_robin":
        out = out.rename({"improvement_vs_round_robin_pct": improvement_pct_col(baseline),
                          "improvement_vs_round_robin_s": improvement_s_col(baseline)})
    return out


def summary_records(df: Frame, by: Sequence[str] = ("router",), baseline: str = "round_robin",
                    slo: Slo | None = None) -> list[dict[str, Any]]:
    """``summarize`` as a list of plain dicts (JSON-ready: NaN becomes None)."""
    rows = summarize(df, by=by, baseline=baseline, slo=slo).to_dicts()
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float) and v != v:
                row[k] = None
    return rows


def to_json(summary: pl.DataFrame) -> str:
    """A summary as JSON rows (NaN as null)."""
    rows = summary.to_dicts()
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float) and v != v:
                row[k] = None
    return json.dumps(rows, indent=2)
