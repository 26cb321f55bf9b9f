"""The report's tables, as numeric Polars frames (rendering lives in ``render.py``).

Every builder takes the derived, loaded request rows and the group keys (``router`` plus
the settings that differ between runs) and returns a ``Table``:

- ``main``: the paper's main table — mean E2E (± std over seeds), the difference from
  round robin in seconds and percent with a paired bootstrap 95% interval, mean router
  wait. When runs differ in chunked prefill, ``chunked_prefill`` is a key column (the
  paper's A100 form).
- ``latency``: TTFT, TBT (mean, p99, max), E2E percentiles, throughput, preemptions.
- ``balance``: per-instance share of requests and tokens (prompt + generated).
- ``instances``: per instance, its profile, requests served, busy fraction, preemptions and mean E2E (a mixed
  fleet's instances side by side).
- ``live``: dispatch lag, achieved vs requested rate, failures (live runs only).
- ``goodput``: share of requests meeting ``--slo`` limits (only when given).
- ``hardware``: runs that differ in profile side by side, one column group per profile
  (and ``by_chunked_prefill``: the same layout for chunked prefill off/on, as in the
  paper's A100 table).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from ..metrics.stats import MEAN, bootstrap_change, side_from_rows
from ..metrics.summary import (Slo, completed_expr, derive, improvement_pct_col, improvement_s_col, slo_met_expr,
                      summarize)


@dataclass
class Table:
    """A titled numeric table; ``name`` is its key in JSON output."""

    name: str
    title: str
    df: pl.DataFrame
    note: str = ""
    keys: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)  # column -> header, beyond the defaults
    #: columns a console table shows only when asked for every column (``lbbench report --wide``), so that the
    #: default one fits a 120-column terminal; Markdown, JSON and HTML always hold them
    wide: tuple[str, ...] = ()


def improvement_cis(lf: pl.LazyFrame, keys: list[str], baseline: str = "round_robin",
                    num_resamples: int = 1000, level: float = 0.95, seed: int = 0) -> pl.DataFrame:
    """Paired bootstrap interval of each group's mean-E2E improvement over the baseline.

    Improvement is ``-change``: positive means faster than the baseline. Groups without a
    baseline for their other keys get nulls.
    """
    rows = (derive(lf).filter(completed_expr())
            .select([*keys, "seed", "request_id", "e2e_s"]).collect())
    out = []
    groups = rows.partition_by(keys, as_dict=True, maintain_order=True)
    for gkey, g in groups.items():
        kv = dict(zip(keys, gkey))
        lo = hi = None
        if kv["router"] != baseline:
            bkey = tuple(baseline if k == "router" else kv[k] for k in keys)
            base = groups.get(bkey)
            if base is not None and base.height and g.height:
                try:
                    ch = bootstrap_change(_side(base), _side(g), MEAN, num_resamples, level, seed)
                    lo, hi = -ch.ci_high_pct, -ch.ci_low_pct
                except ValueError:
                    pass
        else:
            lo = hi = 0.0
        out.append({**kv, "ci_low_pct": lo, "ci_high_pct": hi})
    schema = {k: rows.schema[k] for k in keys} | {"ci_low_pct": pl.Float64, "ci_high_pct": pl.Float64}
    return pl.DataFrame(out, schema=schema)


def _side(g: pl.DataFrame):
    return side_from_rows(g["seed"].to_numpy(), g["request_id"].to_numpy(), g["e2e_s"].to_numpy())


def main_table(lf: pl.LazyFrame, summary: pl.DataFrame, keys: list[str], baseline: str = "round_robin",
               num_resamples: int = 1000) -> Table:
    imp_pct, imp_s = improvement_pct_col(baseline), improvement_s_col(baseline)
    cis = improvement_cis(lf, keys, baseline, num_resamples)
    df = (summary.join(cis, on=keys, how="left", nulls_equal=True, maintain_order="left")
          .select([*keys, "seeds", "mean_e2e_s", "mean_e2e_std_s",
                   pl.col(imp_s).alias("diff_vs_baseline_s"),
                   pl.col(imp_pct).alias("improvement_pct"), "ci_low_pct", "ci_high_pct",
                   "mean_router_wait_s"]))
    form = " (A100 form: by chunked prefill)" if "chunked_prefill" in keys else ""
    note = (f"Difference = {baseline} mean - router mean (positive: faster than {baseline}); "
            f"% paired by seed; 95% CI: paired bootstrap over seeds and requests "
            f"({num_resamples} resamples). ± is the std over seeds of the per-seed mean.")
    headers = {"diff_vs_baseline_s": f"diff vs {baseline} (s)",
               "improvement_pct": f"improvement vs {baseline} (%) [95% CI]"}
    return Table("main", f"Mean end-to-end latency by router{form}", df, note, keys, headers,
                 wide=("seeds", "diff_vs_baseline_s"))


def latency_table(summary: pl.DataFrame, keys: list[str]) -> Table:
    cols = ["mean_ttft_s", "p99_ttft_s", "mean_tbt_s", "p99_tbt_s", "max_tbt_s", "p50_e2e_s",
            "p90_e2e_s", "p99_e2e_s", "throughput_tokens_per_s", "preemptions", "completed",
            "failed"]
    note = ("Per-seed statistics averaged over seeds. TBT: mean of per-request mean gaps; "
            "p99 over requests of per-request p99 gaps; max over all. Preemptions: per seed.")
    return Table("latency", "Latency detail", summary.select([*keys, *cols]), note, keys,
                 wide=("mean_tbt_s", "max_tbt_s", "p90_e2e_s", "throughput_tokens_per_s", "completed"))


def balance_table(lf: pl.LazyFrame, keys: list[str]) -> Table:
    """Per instance: share of requests and of tokens (prompt + generated), over all seeds."""
    tokens = pl.col("prompt_tokens").fill_null(0) + pl.col("generated_tokens").fill_null(0)
    per = (lf.group_by([*keys, "instance"])
           .agg(requests=pl.len().cast(pl.Int64), tokens=tokens.sum().cast(pl.Int64))
           .with_columns(
               requests_share_pct=100.0 * pl.col("requests") / pl.col("requests").sum().over(keys),
               tokens_share_pct=100.0 * pl.col("tokens") / pl.col("tokens").sum().over(keys))
           .collect())
    order = lf.select(keys).unique(maintain_order=True).collect().with_row_index("_g")
    df = (per.join(order, on=keys, how="left", nulls_equal=True)
          .sort(["_g", "instance"]).drop("_g"))
    note = ("Share of all requests and of all tokens (prompt + generated) sent to each instance; "
            "with N instances a perfect balance is 100/N %.")
    return Table("balance", "Per-instance share of requests and tokens", df, note, keys)


def instances_table(lf: pl.LazyFrame, keys: list[str]) -> Table:
    """Per instance, each a mean over seeds: requests served, busy fraction (the time it had at least one
    request between dispatch and finish — the union of those intervals — over the seed's span, first arrival
    to last finish), preemptions; and the mean E2E of its completed requests over every seed. The profile is
    the instance's (``instance_profile``; older records: the run's ``profile``)."""
    d = derive(lf)
    schema = d.collect_schema()
    prof = (pl.col("instance_profile") if "instance_profile" in schema
            else pl.col("profile") if "profile" in schema else pl.lit(None, pl.String))
    seed_keys = [*keys, "seed"]
    inst_keys = [*seed_keys, "instance"]
    span = (d.group_by(seed_keys).agg(span_s=pl.col("finish_s").max() - pl.col("arrival_s").min()))
    served = d.filter(pl.col("instance").is_not_null())
    busy = (served.filter(pl.col("dispatch_s").is_not_null() & pl.col("finish_s").is_not_null())
            .sort([*inst_keys, "dispatch_s"], nulls_last=True)
            .with_columns(_end=pl.col("finish_s").cum_max().shift(1).over(inst_keys))
            .with_columns(_period=(pl.col("_end").is_null() | (pl.col("dispatch_s") > pl.col("_end")))
                          .cast(pl.Int64).cum_sum().over(inst_keys))
            .group_by([*inst_keys, "_period"])
            .agg(_busy=pl.col("finish_s").max() - pl.col("dispatch_s").min())
            .group_by(inst_keys).agg(busy_s=pl.col("_busy").sum()))
    per_seed = (served.group_by(inst_keys)
                .agg(instance_profile=prof.first(), requests=pl.len().cast(pl.Int64),
                     preemptions=pl.col("num_preemptions").fill_null(0).sum().cast(pl.Int64),
                     _e2e_sum=pl.col("e2e_s").filter(completed_expr()).sum(),
                     _e2e_n=completed_expr().sum())
                .join(busy, on=inst_keys, how="left", nulls_equal=True)
                .join(span, on=seed_keys, how="left", nulls_equal=True)
                .with_columns(busy_fraction=pl.when(pl.col("span_s") > 0)
                              .then(pl.col("busy_s").fill_null(0.0) / pl.col("span_s"))))
    per = (per_seed.group_by([*keys, "instance"])
           .agg(instance_profile=pl.col("instance_profile").first(),
                requests=pl.col("requests").mean(), busy_fraction=pl.col("busy_fraction").mean(),
                preemptions=pl.col("preemptions").mean(),
                mean_e2e_s=pl.when(pl.col("_e2e_n").sum() > 0)
                .then(pl.col("_e2e_sum").sum() / pl.col("_e2e_n").sum()))
           .collect())
    order = lf.select(keys).unique(maintain_order=True).collect().with_row_index("_g")
    df = per.join(order, on=keys, how="left", nulls_equal=True).sort(["_g", "instance"]).drop("_g")
    note = ("Per instance, mean over seeds: requests served, busy fraction (time with at least one request "
            "between dispatch and finish, over first arrival to last finish), preemptions; mean E2E of its "
            "completed requests.")
    return Table("instances", "Per instance: profile, requests, busy fraction, preemptions, E2E", df, note,
                 keys, {"instance_profile": "profile", "requests": "requests served",
                        "busy_fraction": "busy fraction"})


def imbalance(balance: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Largest instance share over the fair share (1.0 = perfectly even), per group."""
    return (balance.group_by(keys, maintain_order=True)
            .agg(instances=pl.len(),
                 tokens_imbalance=pl.col("tokens_share_pct").max() * pl.len() / 100.0,
                 requests_imbalance=pl.col("requests_share_pct").max() * pl.len() / 100.0))


def live_table(summary: pl.DataFrame, keys: list[str]) -> Table | None:
    live = summary.filter(pl.col("achieved_rate_per_s").is_not_null()
                          | pl.col("dispatch_lag_p50_s").is_not_null())
    if live.height == 0:
        return None
    df = live.select([*keys, "dispatch_lag_p50_s", "dispatch_lag_p99_s", "requested_rate_per_s",
                      "achieved_rate_per_s", "completed", "failed"])
    note = "Dispatch lag = actual - planned send time; rates per second of the send/arrival span."
    return Table("live", "Live run: dispatch lag, rate and failures", df, note, keys, wide=("dispatch_lag_p50_s",))


def goodput_table(lf: pl.LazyFrame, keys: list[str], slo: Slo) -> Table:
    """Per seed: share of *all* requests that completed within every limit; mean over seeds."""
    d = derive(lf)
    ok = slo_met_expr(slo)
    span = pl.col("finish_s").max() - pl.col("arrival_s").min()
    df = (d.group_by([*keys, "seed"], maintain_order=True)
          .agg(goodput_pct=100.0 * ok.mean(), met=ok.sum(),
               goodput_requests_per_s=pl.when(span > 0).then(ok.sum() / span))
          .group_by(keys, maintain_order=True)
          .agg(goodput_pct=pl.col("goodput_pct").mean(),
               goodput_requests_per_s=pl.col("goodput_requests_per_s").mean(),
               met_slo=pl.col("met").sum().cast(pl.Int64))
          .collect())
    note = (f"SLO: {slo.describe()} (TBT is each request's mean gap). Failed requests count as "
            "misses; per-seed shares averaged over seeds.")
    return Table("goodput", "Goodput under SLOs", df, note, keys)


HARDWARE_METRICS = ("mean_e2e_s", "improvement_vs_baseline_pct", "p99_e2e_s", "mean_ttft_s",
                    "throughput_tokens_per_s")


def hardware_table(summary: pl.DataFrame, keys: list[str], baseline: str = "round_robin",
                   split: str = "profile") -> Table | None:
    """Routers (and the other keys) as rows, one column group per value of ``split``."""
    if split not in keys:
        return None
    rows = [k for k in keys if k != split]
    s = summary.rename({improvement_pct_col(baseline): "improvement_vs_baseline_pct"})
    values = s[split].unique(maintain_order=True).to_list()
    out = s.select(rows).unique(maintain_order=True)
    for v in values:
        label = _group_label(split, v)
        part = (s.filter(pl.col(split).eq_missing(v))
                .select([*rows, *[pl.col(m).alias(f"{label} | {m}") for m in HARDWARE_METRICS]]))
        out = out.join(part, on=rows, how="left", nulls_equal=True, maintain_order="left")
    what = split.replace("_", " ")
    note = f"One column group per {what}; improvement is over {baseline} with the same {what}."
    name = "hardware" if split == "profile" else f"by_{split}"
    wide = tuple(c for c in out.columns if " | " in c and not c.endswith(HARDWARE_METRICS[:2]))
    return Table(name, f"Side by side by {what}", out, note, rows, wide=wide)


def _group_label(split: str, value: object) -> str:
    if isinstance(value, bool):
        return f"{split.replace('_', ' ')} {'on' if value else 'off'}"
    return str(value)


def build_tables(lf: pl.LazyFrame, keys: list[str], baseline: str = "round_robin",
                 slo: Slo | None = None, num_resamples: int = 1000) -> list[Table]:
    """Every table that applies to these runs, in report order."""
    summary = summarize(lf, by=keys, baseline=baseline)
    tables = [main_table(lf, summary, keys, baseline, num_resamples)]
    for split in ("profile", "chunked_prefill"):
        side = hardware_table(summary, keys, baseline, split)
        if side is not None:
            tables.append(side)
    tables.append(latency_table(summary, keys))
    bal = balance_table(lf, keys)
    tables.append(Table("imbalance", "Instance imbalance", imbalance(bal.df, keys),
                        "Largest instance share divided by the fair share (1.00 = even).", keys))
    tables.append(bal)
    tables.append(instances_table(lf, keys))
    live = live_table(summary, keys)
    if live is not None:
        tables.append(live)
    if slo is not None:
        tables.append(goodput_table(lf, keys, slo))
    return tables
