"""The report's decision section, from the runs' ``decisions.parquet`` (``lbbench run --decisions``).

Per router: how many decisions, deferrals and counterfactuals; then, where counterfactuals were run
(``--counterfactual K``), regret (the chosen action's rollout cost minus the cheapest evaluated one's, in
seconds of summed E2E) by load (queue length at the router, requests outstanding on the instances) and by
request size (prompt and predicted output tokens of the request decided), the share of decisions whose
regret exceeds ``REGRET_THRESHOLD_S``, and the decisions with the largest regret.
"""

from __future__ import annotations


import polars as pl

from .tables import Table

#: a decision "costs" when its regret exceeds this many seconds
REGRET_THRESHOLD_S = 0.1
TOP = 10

QUEUE_BINS = ([1, 4, 16], ["1", "2-4", "5-16", ">16"])
OUTSTANDING_BINS = ([8, 32, 96], ["0-8", "9-32", "33-96", ">96"])
PROMPT_BINS = ([255, 1023, 4095], ["<256", "256-1023", "1024-4095", ">=4096"])
OUTPUT_BINS = ([127, 511], ["<128", "128-511", ">=512"])


def _bin(col: pl.Expr, bins: tuple[list[int], list[str]]) -> pl.Expr:
    """The label of the bin ``col`` falls in (upper edges inclusive), prefixed by its rank so that it sorts."""
    edges, labels = bins
    expr = pl.when(col <= edges[0]).then(pl.lit(f"0 {labels[0]}"))
    for k in range(1, len(edges)):
        expr = expr.when(col <= edges[k]).then(pl.lit(f"{k} {labels[k]}"))
    return expr.otherwise(pl.lit(f"{len(edges)} {labels[-1]}"))


def _regret_stats() -> list[pl.Expr]:
    r = pl.col("regret_s")
    return [pl.len().alias("decisions"), r.mean().alias("mean_regret_s"),
            (r > REGRET_THRESHOLD_S).mean().alias("frac_regret_gt_0_1s"), r.max().alias("max_regret_s")]


def decision_tables(df: pl.DataFrame | None) -> list[Table]:
    """The decision section's tables (none without decisions)."""
    if df is None or df.height == 0:
        return []
    keys = ["router"]
    overview = (df.group_by(keys, maintain_order=True)
                .agg(pl.len().alias("decisions"), pl.col("chosen_instance").is_null().sum().alias("deferrals"),
                     pl.col("scores").is_not_null().mean().alias("frac_with_scores"),
                     pl.col("regret_s").is_not_null().sum().alias("counterfactuals"),
                     pl.col("regret_s").mean().alias("mean_regret_s"),
                     (pl.col("regret_s") > REGRET_THRESHOLD_S).sum().alias("regret_gt_0_1s"))
                .with_columns((pl.col("regret_gt_0_1s") / pl.col("counterfactuals")).alias("frac_regret_gt_0_1s")))
    tables = [Table("decisions", "Routing decisions", overview,
                    f"regret: the chosen action's rollout cost minus the cheapest evaluated alternative's (s of summed "
                    f"E2E, the planner's horizon and costs); frac > {REGRET_THRESHOLD_S:g} s of decisions with a "
                    "counterfactual", keys)]
    cf = df.filter(pl.col("regret_s").is_not_null())
    if cf.height == 0:
        return tables
    cf = cf.with_columns(total_outstanding=pl.col("outstanding").list.sum())
    by_load = (cf.with_columns(_bin(pl.col("queue_len"), QUEUE_BINS).alias("queue_len_bin"),
                               _bin(pl.col("total_outstanding"), OUTSTANDING_BINS).alias("outstanding_bin"))
               .group_by([*keys, "queue_len_bin", "outstanding_bin"]).agg(_regret_stats())
               .sort([*keys, "queue_len_bin", "outstanding_bin"]))
    by_size = (cf.with_columns(_bin(pl.col("head_prompt_tokens"), PROMPT_BINS).alias("prompt_bin"),
                               _bin(pl.col("head_predicted_output_tokens"), OUTPUT_BINS).alias("predicted_output_bin"))
               .group_by([*keys, "prompt_bin", "predicted_output_bin"]).agg(_regret_stats())
               .sort([*keys, "prompt_bin", "predicted_output_bin"]))
    best = pl.col("cf_instances").list.get(pl.col("cf_costs").list.arg_min())
    top = (cf.sort("regret_s", descending=True).head(TOP)
           .select("router", "seed", "decision", "time_s", "head_request_id", "head_prompt_tokens",
                   "head_predicted_output_tokens", "queue_len", "total_outstanding", "chosen_instance",
                   best.alias("best_instance"), "regret_s"))
    return tables + [
        Table("regret_by_load", "Regret by load (queue length at the router x requests outstanding)",
              _unrank(by_load, "queue_len_bin", "outstanding_bin"), "", keys),
        Table("regret_by_size", "Regret by request size (prompt x predicted output tokens)",
              _unrank(by_size, "prompt_bin", "predicted_output_bin"), "", keys),
        Table("top_regret", f"The {TOP} decisions with the largest regret", top,
              "best_instance -1: deferring was cheapest", keys),
    ]


def _unrank(df: pl.DataFrame, *cols: str) -> pl.DataFrame:
    """The bins' labels without the rank that sorted them."""
    return df.with_columns([pl.col(c).str.splitn(" ", 2).struct.field("field_1").alias(c) for c in cols])
