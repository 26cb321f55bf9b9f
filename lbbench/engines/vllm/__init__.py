"""vLLM's OpenAI-compatible dialect: its request extensions and its Prometheus metric names."""

from __future__ import annotations

from ..engine import Engine

VLLM = Engine(
    name="vllm",
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    # vLLM V1 renamed gpu_cache_usage_perc to kv_cache_usage_perc; either is read
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    preemptions=("vllm:num_preemptions_total",),
    prefix_queries="vllm:prefix_cache_queries_total",
    prefix_hits="vllm:prefix_cache_hits_total",
    cache_config_info="vllm:cache_config_info",
    token_count_fields={"return_token_ids": True},
)
