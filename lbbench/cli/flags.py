"""From the library's field names to the flags a user typed.

Library errors name what is wrong in the library's terms (``lbbench.errors``): a ``RunConfig`` field, a trace
option, a predictor spec. This table says which flag sets each, so that the one line a user reads names the
flag (``--rate: -1 must be > 0 requests/s``). A field with no flag keeps its own name.
"""

from __future__ import annotations

import re

FLAGS: dict[str, str] = {
    # RunConfig
    "profile": "--profile", "instances": "--instances", "instance_schedulers": "--instance-scheduler",
    "chunked_prefill": "--chunked-prefill", "prefix_caching": "--prefix-caching", "workload": "--workload",
    "trace": "--trace", "rate_per_s": "--rate", "rates": "--rate", "requests": "--requests", "orders": "--order",
    "seeds": "--seeds", "seed": "--seed", "burstiness": "--burstiness", "prompt_tokens": "--prompt-tokens",
    "output_tokens": "--output-tokens", "routers": "--router", "router_options": "--router-opt",
    "predictor": "--predictor", "timeline_interval_s": "--timeline-interval", "slo": "--slo", "jobs": "--jobs",
    "endpoints": "--endpoint", "endpoint": "--endpoint", "launch_model": "--launch", "model": "--model",
    "api": "--api", "engine": "--engine", "prompt_mode": "--prompt-mode", "tokenizer": "--tokenizer",
    "vllm_python": "--vllm-python", "request_timeout_s": "--request-timeout", "checkpoint": "--checkpoint",
    "stream_workers": "--stream-workers",
    # trace options (lbbench run --trace, lbbench trace ...)
    "trace_format": "--trace-format", "mapping": "--mapping", "skip_bad_rows": "--skip-bad-rows",
    "time_scale": "--time-scale", "window": "--window", "max_prompt_tokens": "--max-prompt-tokens",
    "prompt_overflow": "--prompt-overflow",
    # other commands
    "router": "--router", "data": "--data", "pair": "--pair", "max_regression": "--max-regression",
    "metric": "--metric", "test_fraction": "--test-fraction", "port_base": "--port-base", "port": "--port",
    "kind": "--kind", "guidance_schedule": "--guidance-schedule", "format": "--format",
    "estimator": "--estimator", "discount": "--discount", "max_model_len": "--max-model-len",
    "num_requests": "--requests", "scheme": "--scheme", "encoder": "--encoder",
}

_LEADING_FIELD = re.compile(r"^([a-z][a-z_]*)(?=[: ])")


def user_message(exc: BaseException) -> str:
    """The first line of a user error, with a leading field name replaced by its flag."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    m = _LEADING_FIELD.match(text)
    if m and m.group(1) in FLAGS:
        return FLAGS[m.group(1)] + text[len(m.group(1)):]
    return text
