"""What several command modules share beyond flags: the error console, and the live steps of
``lbbench fidelity`` and ``lbbench profile calibrate`` (the workload's requests, the instances to replay on)."""

from __future__ import annotations

import contextlib
from typing import Any

import click
from rich.console import Console

from ..experiment import RunConfig, build_requests
from ..predict import annotate, load_predictor

err_console = Console(stderr=True)


def requests_for(prof: Any, profile_name: str, *, workload: str, trace: str | None, max_prompt_tokens: int | None,
                 rate: float, requests: int, seed: int, prompt_tokens: str, output_tokens: str, predictor: str,
                 trace_options: dict | None = None, burstiness: float = 1.0) -> list:
    """The requests of a workload (or trace) for ``prof``, annotated by ``predictor``."""
    opts = dict(trace_options or {})
    if max_prompt_tokens:
        opts["max_prompt_tokens"] = max_prompt_tokens
    cfg = RunConfig(profile=profile_name, workload=workload, trace=trace, rate_per_s=rate, requests=requests,
                    trace_options=opts, seed=seed, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                    predictor=predictor, burstiness=burstiness)
    return annotate(build_requests(cfg, prof, seed, None), load_predictor(predictor, profile=prof, seed=seed))


def launch_as_profile(prof: Any, launch_model: str | None, endpoint: Any, instances: int, *, vllm_python: Any,
                      log_dir: Any, port_base: int, cpus_per_instance: int | None = None,
                      api_server_cores: str = "client") -> Any:
    """The live instances: ``--launch`` started as the profile's engine is configured, else ``--endpoint``s."""
    from ..engines.vllm.launcher import launch  # lazy: start-up time (the launcher loads the live client stack)

    if bool(endpoint) == (launch_model is not None):
        raise click.UsageError("give --endpoint URL (one per instance) or --launch MODEL, not both")
    if launch_model is None:
        return contextlib.nullcontext(list(endpoint))
    extra = [] if prof.enable_prefix_caching else ["--no-enable-prefix-caching"]
    if not prof.chunked_prefill:  # vLLM without chunked prefill needs max_num_batched_tokens >= max_model_len
        extra += ["--max-model-len", str(prof.max_model_len)]
    return launch(launch_model, instances, chunked_prefill=prof.chunked_prefill, max_num_seqs=prof.max_num_seqs,
                  max_num_batched_tokens=prof.max_num_batched_tokens, vllm_python=vllm_python,
                  log_dir=log_dir, port_base=port_base, extra_args=extra, cpus_per_instance=cpus_per_instance,
                  front_end=api_server_cores,
                  # vLLM's /reset_prefix_cache (dev mode) lets every replay start on a cold cache
                  extra_env={"VLLM_SERVER_DEV_MODE": "1"} if prof.enable_prefix_caching else None)
