"""SGLang's OpenAI-compatible dialect.

The names follow SGLang's ``metrics/collector.py`` and its documentation: ``sglang:num_running_reqs``,
``sglang:num_queue_reqs``, ``sglang:token_usage`` (the share of KV tokens in use), ``sglang:cached_tokens_total``
over ``sglang:prompt_tokens_total`` for the prefix-cache hit rate. SGLang exports retractions (its preemptions) as
a per-batch gauge, not a cumulative counter, so no preemption count is read from it. Its completions API takes
``min_tokens`` and ``ignore_eos`` as vLLM's does and has no ``return_token_ids`` (tokens are then counted one per
non-empty streamed chunk, or from the usage counts).
"""

from __future__ import annotations

from .engine import Engine

SGLANG = Engine(
    name="sglang",
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
    prefix_queries="sglang:prompt_tokens_total",
    prefix_hits="sglang:cached_tokens_total",
)
