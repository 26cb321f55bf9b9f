"""Prefill/decode disaggregation in a run's report: the TTFT split and the KV transfers, and each role's load.

``disagg_table`` (from the records; a run without a disaggregated request has none), per group and a mean over
seeds: the share of requests disaggregated, the mean TTFT of all completed requests, and over the
disaggregated ones the TTFT split into the router's queue (``dispatch - arrival``), the prefill instance (its
queue and the prefill, ``prefill_done - dispatch``), the transfer (the link's queue, latency and bytes,
``kv_ready - prefill_done``), the wait for decode blocks (``decode_admit - kv_ready``) and the first decode step
(``first_token - decode_admit``); the mean and p99 transfer time and the mean KV moved per request.

``roles_table`` (from the timeline and the fleet's roles), per group and role, means over the samples of every
instance of that role: requests running (its utilisation in batch slots), waiting (its queue), KV in use.
"""

from __future__ import annotations

from typing import Sequence

import polars as pl

from ..metrics.summary import completed_expr, derive
from .tables import Table

SPLIT = {"router_wait_s": ("dispatch_s", "arrival_s"), "prefill_s": ("prefill_done_s", "dispatch_s"),
         "transfer_s": ("kv_ready_s", "prefill_done_s"), "decode_wait_s": ("decode_admit_s", "kv_ready_s"),
         "first_step_s": ("first_token_s", "decode_admit_s")}


def disagg_table(lf: pl.LazyFrame, keys: list[str]) -> Table | None:
    """The TTFT split and transfers per group (None when no request was disaggregated)."""
    schema = lf.collect_schema()
    if "prefill_instance" not in schema:
        return None
    d = derive(lf)
    moved = pl.col("prefill_instance").is_not_null() & completed_expr()
    per_seed = d.group_by([*keys, "seed"]).agg(
        disaggregated=pl.col("prefill_instance").is_not_null().mean(),
        mean_ttft_s=pl.col("ttft_s").filter(completed_expr()).mean(),
        **{f"mean_{k}": (pl.col(a) - pl.col(b)).filter(moved).mean() for k, (a, b) in SPLIT.items()},
        p99_transfer_s=(pl.col("kv_ready_s") - pl.col("prefill_done_s")).filter(moved).quantile(0.99, "linear"),
        mean_transfer_mb=(pl.col("transfer_bytes") / 1e6).filter(moved).mean())
    cols = [c for c in per_seed.collect_schema().names() if c not in (*keys, "seed")]
    df = per_seed.group_by(keys).agg([pl.col(c).mean() for c in cols]).collect()
    if df["disaggregated"].fill_null(0).max() == 0:
        return None
    order = lf.select(keys).unique(maintain_order=True).collect().with_row_index("_g")
    df = df.join(order, on=keys, how="left", nulls_equal=True).sort("_g").drop("_g")
    note = ("Mean over seeds. The split is over the disaggregated requests: router queue, prefill instance "
            "(queue and prefill), KV transfer (link queue, latency, bytes), wait on the decode instance (its next "
            "step boundary, and blocks), first decode step; TTFT over every completed request.")
    return Table("disaggregation", "Prefill/decode: TTFT split and KV transfers", df, note, keys,
                 {"disaggregated": "share P/D", "mean_router_wait_s": "router", "mean_prefill_s": "prefill",
                  "mean_transfer_s": "transfer", "mean_decode_wait_s": "decode wait",
                  "mean_first_step_s": "1st step", "p99_transfer_s": "p99 transfer", "mean_transfer_mb": "MB"})


def roles_table(timeline: pl.LazyFrame, keys: list[str], roles: Sequence[str]) -> Table:
    """Each role's mean running and waiting requests and KV use per instance, over the timeline's samples."""
    role_of = pl.DataFrame({"instance": list(range(len(roles))), "role": list(roles)},
                           schema={"instance": pl.Int64, "role": pl.String})
    keys = [k for k in keys if k in timeline.collect_schema()]
    df = (timeline.join(role_of.lazy(), on="instance", how="left")
          .group_by([*keys, "role"])
          .agg(instances=pl.col("instance").n_unique(), mean_running=pl.col("num_running").mean(),
               mean_waiting=pl.col("num_waiting").mean(), mean_kv_usage=pl.col("kv_usage").mean())
          .sort([*keys, "role"]).collect())
    note = "Per instance of each role, mean over the timeline's samples (every seed): running, waiting, KV in use."
    return Table("roles", "Prefill/decode: load per role", df, note, [*keys, "role"],
                 {"mean_running": "running", "mean_waiting": "waiting", "mean_kv_usage": "KV use"})
