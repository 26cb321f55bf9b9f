"""Scraping an engine's Prometheus ``/metrics`` into ``MetricsSample`` events.

Only the four gauges/counters a router or a report needs are read: running and
waiting requests, KV-cache usage (0..1) and the cumulative preemption count,
under the names the engine uses (:mod:`lbbench.engines`; vLLM by default).
Label sets (one per served model) are summed; KV usage takes the maximum. The
parser looks only at lines that start with those names, so a scrape of a real
server's few hundred lines costs well under a millisecond.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engines import VLLM, Engine


@dataclass(frozen=True, slots=True)
class ScrapedMetrics:
    num_running: int
    num_waiting: int
    kv_usage: float
    num_preemptions: int


def _value(line: str) -> float:
    # "name{labels} value [timestamp]" or "name value"
    rest = line[line.rindex("}") + 1:] if "}" in line else line.split(None, 1)[1]
    return float(rest.split()[0])


def parse_metrics(text: str, engine: Engine = VLLM) -> ScrapedMetrics | None:
    """Read ``engine``'s gauges from a Prometheus text page; None when none is there."""
    running = waiting = preemptions = 0.0
    kv = 0.0
    seen = False
    prefixes = engine.metric_prefixes
    for line in text.splitlines():
        if not line.startswith(prefixes):
            continue
        name = line.split("{", 1)[0].split(None, 1)[0]
        try:
            v = _value(line)
        except (ValueError, IndexError):
            continue
        seen = True
        if name in engine.running:
            running += v
        elif name in engine.waiting:
            waiting += v
        elif name in engine.preemptions:
            preemptions += v
        elif name in engine.kv_usage:
            kv = max(kv, v)
    if not seen:
        return None
    return ScrapedMetrics(int(running), int(waiting), kv, int(preemptions))


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
