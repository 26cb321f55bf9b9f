"""Measured rows for the validation tests: small, written here, with the shared table's columns."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

COLUMNS = ("id,stage,source,model,gpu,tp,replicas,weights_dtype,kv_dtype,engine,engine_version,max_num_seqs,"
           "max_num_batched_tokens,max_model_len,gpu_memory_utilization,long_prefill_token_threshold,prefix_caching,"
           "cpu_offload_gib,gpu_kv_blocks,arrival,rate_rps,duration_s,requests,prompt_tokens_mean,prompt_tokens_max,"
           "prefix_groups,prompts_per_group,system_prompt_tokens,question_tokens,multi_turn,output_tokens,ignore_eos,"
           "ttft_mean_ms,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,itl_mean_ms,tpot_p50_ms,tpot_p99_ms,e2e_mean_ms,e2e_p50_ms,"
           "e2e_p90_ms,e2e_p99_ms,throughput_rps,output_tok_s").split(",")


def shared_prefix_row(**kw) -> dict[str, str]:
    """A two-group, two-user inference-perf shared_prefix stage on Llama-3.1-8B / H100 (measured values invented
    for the test; each test says what it checks of them)."""
    row = {c: "" for c in COLUMNS}
    row.update(id="exp-a", stage="0", source="test", model="meta-llama/Llama-3.1-8B-Instruct", gpu="h100", tp="1",
               replicas="1", weights_dtype="bf16", kv_dtype="auto", engine="vllm", engine_version="0.15.1",
               max_num_seqs="64", max_num_batched_tokens="2048", max_model_len="4096", gpu_memory_utilization="0.9",
               prefix_caching="true", arrival="constant", rate_rps="2", duration_s="20", requests="40",
               prefix_groups="2", prompts_per_group="2", system_prompt_tokens="64", question_tokens="200",
               multi_turn="true", output_tokens="32", ignore_eos="true", ttft_mean_ms="30", e2e_mean_ms="250",
               itl_mean_ms="7", throughput_rps="2", output_tok_s="64")
    row.update({k: str(v) for k, v in kw.items()})
    return row


def write_rows(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture
def small_table(tmp_path: Path) -> Path:
    return write_rows(tmp_path / "measured.csv", [shared_prefix_row(), shared_prefix_row(stage="1", rate_rps="4",
                                                                                         requests="80")])
