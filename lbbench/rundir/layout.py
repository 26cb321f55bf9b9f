"""What a run directory holds: its file names and the schemas of its tables, and the frames in those schemas.

Every other module names a run file through these constants (the package docstring lists what each holds).
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl

from ..core import RECORD_FIELDS, RequestRecord

RUN_TOML = "run.toml"
REQUESTS_FILE = "requests.parquet"
TIMELINE_FILE = "timeline.parquet"
#: live runs before the timeline was one file wrote scraped samples here
METRICS_FILE = "metrics.parquet"
SUMMARY_FILE = "summary.parquet"
DECISIONS_FILE = "decisions.parquet"
#: a live unit's streamed records: ``partial/<unit>/``
PARTIAL_DIR = "partial"
#: each record as its request ends, one JSON line (the partial records of an interrupted run)
PARTIAL_RECORDS = "requests.partial.jsonl"
#: the Parquet chunks of a unit's streamed records, ``records-00000.parquet`` on
CHUNK_GLOB = "records-*.parquet"
CHUNK_NAME = "records-{:05d}.parquet"
#: ``lbbench headroom``'s table, beside its parts' run directories
HEADROOM_FILE = "headroom.parquet"

#: the ``requests.parquet`` types of ``RequestRecord``'s fields
RECORD_SCHEMA: dict[str, Any] = {
    "run_id": pl.Utf8, "router": pl.Utf8, "seed": pl.Int64, "request_id": pl.Int64, "task": pl.Utf8,
    "instance": pl.Int64, "arrival_s": pl.Float64, "dispatch_s": pl.Float64,
    "first_token_s": pl.Float64, "finish_s": pl.Float64, "prompt_tokens": pl.Int64,
    "output_tokens": pl.Int64, "generated_tokens": pl.Int64, "predicted_output_tokens": pl.Int64,
    "predicted_bucket": pl.Int64, "num_preemptions": pl.Int64, "tbt_mean_s": pl.Float64,
    "tbt_p99_s": pl.Float64, "tbt_max_s": pl.Float64, "planned_send_s": pl.Float64,
    "actual_send_s": pl.Float64, "server_prompt_tokens": pl.Int64, "server_output_tokens": pl.Int64,
    "http_status": pl.Int64, "error": pl.Utf8, "session_id": pl.Int64, "turn": pl.Int64,
    "think_s": pl.Float64, "cached_prompt_tokens": pl.Int64,
    "prefill_instance": pl.Int64, "prefill_done_s": pl.Float64, "kv_ready_s": pl.Float64,
    "decode_admit_s": pl.Float64, "transfer_bytes": pl.Float64,
}
TIMELINE_SCHEMA: dict[str, Any] = {
    "time_s": pl.Float64, "instance": pl.Int64, "num_running": pl.Int64, "num_waiting": pl.Int64,
    "kv_usage": pl.Float64, "num_preemptions": pl.Int64, "prefix_cache_hit_rate": pl.Float64,
}
DECISION_SCHEMA: dict[str, Any] = {
    "decision": pl.Int64, "time_s": pl.Float64, "queue_len": pl.Int64, "head_request_id": pl.Int64,
    "head_prompt_tokens": pl.Int64, "head_predicted_output_tokens": pl.Int64,
    "chosen_instance": pl.Int64, "chosen_request_id": pl.Int64,
    "outstanding": pl.List(pl.Int64), "prefilling": pl.List(pl.Int64), "pending_prompt_tokens": pl.List(pl.Int64),
    "context_tokens": pl.List(pl.Int64), "kv_usage": pl.List(pl.Float64),
    "predicted_tokens_remaining": pl.List(pl.Int64), "scores": pl.List(pl.Float64),
    "cf_instances": pl.List(pl.Int64), "cf_costs": pl.List(pl.Float64), "chosen_cost_s": pl.Float64,
    "regret_s": pl.Float64,
}
"""``decisions.parquet`` (``lbbench.experiment.decisions``): ``chosen_instance`` null: a deferral. ``scores``
null: the router offers none. ``cf_instances`` (-1: the deferral) and ``cf_costs``: the candidates' rollout
costs, null where no counterfactual was run."""
#: run-level columns of ``requests.parquet`` that describe the configuration (reports group by those that vary)
SETTING_COLUMNS: tuple[str, ...] = ("profile", "workload", "num_instances", "instance_scheduler",
                                    "chunked_prefill", "order", "rate_per_s", "backend")


def records_frame(records: Sequence[RequestRecord], extra: dict[str, Any]) -> pl.DataFrame:
    """The ``requests.parquet`` rows of one unit's records, with the run-level columns ``extra``."""
    cols = {name: [getattr(r, name) for r in records] for name in RECORD_FIELDS}
    df = pl.DataFrame(cols, schema=RECORD_SCHEMA)
    return df.with_columns([pl.lit(v).alias(k) for k, v in extra.items()])


def timeline_frame(rows: Sequence[tuple] | pl.DataFrame, extra: dict[str, Any]) -> pl.DataFrame | None:
    """The ``timeline.parquet`` rows of one unit (tuples in ``TIMELINE_SCHEMA`` order, a missing hit rate
    allowed), with the unit's columns ``extra``; None when there are none."""
    if isinstance(rows, pl.DataFrame):
        df = rows
    else:
        if not rows:
            return None
        width = len(rows[0])
        names = list(TIMELINE_SCHEMA)[:width]
        df = pl.DataFrame(list(rows), schema={k: TIMELINE_SCHEMA[k] for k in names}, orient="row")
    if df.height == 0:
        return None
    if "prefix_cache_hit_rate" not in df.columns:
        df = df.with_columns(pl.lit(None, pl.Float64).alias("prefix_cache_hit_rate"))
    return df.with_columns([pl.lit(v, pl.Float64 if k == "rate_per_s" else None).alias(k)
                            for k, v in extra.items()])
