"""vLLM's Prometheus ``/metrics`` page, written: what the emulator (``serve-sim``) serves, under vLLM's names.

The reader of such pages is engine-neutral and lives with the live client (``lbbench.live.metrics``).
"""

from __future__ import annotations


def render_metrics(model: str, num_running: int, num_waiting: int, kv_usage: float,
                   num_preemptions: int, prompt_tokens_total: int = 0,
                   generation_tokens_total: int = 0, num_finished_total: int = 0,
                   cache_config: dict | None = None) -> str:
    """A Prometheus text page with vLLM's metric names (used by the emulator); ``cache_config`` adds vLLM's
    ``vllm:cache_config_info`` gauge (KV blocks and block size as labels)."""
    lab = f'{{model_name="{model}"}}'
    info = ""
    if cache_config:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(cache_config.items()))
        info = ("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                "# TYPE vllm:cache_config_info gauge\n"
                f"vllm:cache_config_info{{{labels}}} 1.0\n")
    return info + (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{lab} {num_running}\n"
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{lab} {num_waiting}\n"
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{lab} {kv_usage}\n"
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
        "# TYPE vllm:num_preemptions_total counter\n"
        f"vllm:num_preemptions_total{lab} {num_preemptions}\n"
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
        "# TYPE vllm:prompt_tokens_total counter\n"
        f"vllm:prompt_tokens_total{lab} {prompt_tokens_total}\n"
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
        "# TYPE vllm:generation_tokens_total counter\n"
        f"vllm:generation_tokens_total{lab} {generation_tokens_total}\n"
        "# HELP vllm:request_success_total Count of successfully processed requests.\n"
        "# TYPE vllm:request_success_total counter\n"
        f'vllm:request_success_total{{finished_reason="length",model_name="{model}"}} '
        f"{num_finished_total}\n"
    )
