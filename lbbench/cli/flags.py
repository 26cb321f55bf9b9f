"""From the library's field names to the flags a user typed.

Library errors name what is wrong in the library's terms (``lbbench.errors``): a ``RunConfig`` field, a trace
option, a predictor spec. This table says which flag sets each, so that the one line a user reads names the
flag (``--rate: -1 must be > 0 requests/s``). A field with no flag keeps its own name.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import click

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
    "stream_workers": "--stream-workers", "load_workers": "--load-workers", "send_lead_s": "--send-lead",
    "ray_address": "--ray", "ray": "--ray",
    # trace options (lbbench run --trace, lbbench trace ...)
    "trace_format": "--trace-format", "mapping": "--mapping", "skip_bad_rows": "--skip-bad-rows",
    "time_scale": "--time-scale", "window": "--window", "max_prompt_tokens": "--max-prompt-tokens",
    "prompt_overflow": "--prompt-overflow",
    # lbbench plan
    "gpu": "--gpu", "tp": "--tp", "attainment": "--attainment", "max_instances": "--max-instances",
    "price_file": "--price-file",
    # other commands
    "router": "--router", "data": "--data", "pair": "--pair", "max_regression": "--max-regression",
    "metric": "--metric", "test_fraction": "--test-fraction", "port_base": "--port-base", "port": "--port",
    "kind": "--kind", "guidance_schedule": "--guidance-schedule", "format": "--format",
    "estimator": "--estimator", "discount": "--discount", "max_model_len": "--max-model-len",
    "num_requests": "--requests", "scheme": "--scheme", "encoder": "--encoder",
    "cpus_per_instance": "--cpus-per-instance", "api_server_cores": "--api-server-cores",
    "calibrate_on": "--calibrate-on", "check_on": "--check-on",
}

_LEADING_FIELD = re.compile(r"^([a-z][a-z_]*)(?=[: ])")


def user_message(exc: BaseException) -> str:
    """The first line of a user error, with a leading field name replaced by its flag."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    m = _LEADING_FIELD.match(text)
    if m and m.group(1) in FLAGS:
        return FLAGS[m.group(1)] + text[len(m.group(1)):]
    return text


def api_server_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--api-server-cores client|instance`` -> keyword ``api_server_cores`` (with ``--cpus-per-instance``)."""
    return click.option("--api-server-cores", "api_server_cores", type=click.Choice(["client", "instance"]),
                        default="client", show_default=True,
                        help="Where each CPU instance's API server (HTTP, tokenizer, detokenizer, streaming) "
                             "runs when --cpus-per-instance pins it: client, on the client's cores, leaving the "
                             "instance's cores to its engine core alone, as a GPU host leaves the GPU to the model; "
                             "instance, beside its engine core.")(f)


def ray_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--ray [auto|ADDRESS]`` -> keyword ``ray_address``: None without the flag, ``"auto"`` for ``--ray`` alone.

    ``auto`` joins the cluster named by ``RAY_ADDRESS`` when it is set, else a cluster running on this machine
    (``ray start --head``), else starts a local one. ``RAY_ADDRESS`` alone does not turn Ray on.
    Give the value to ``lbbench.distributed.get_executor(jobs, ray_address)``.
    """
    return click.option(
        "--ray", "ray_address", is_flag=False, flag_value="auto", default=None, metavar="[auto|ADDRESS]",
        help="Run the simulated units as Ray tasks (needs the ray extra). `--ray` alone = auto: the cluster in "
             "RAY_ADDRESS, else one started on this machine with `ray start --head`, else a local one; or "
             "HEAD:6379 / ray://HEAD:10001.")(f)
