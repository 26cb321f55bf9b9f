"""What several command modules share beyond flags: the error console, and the live instances that
``lbbench fidelity`` and ``lbbench profile calibrate`` replay on (launched or attached)."""

from __future__ import annotations

import contextlib
from typing import Any

import click
from rich.console import Console

from ..engines.vllm.launcher import launch

err_console = Console(stderr=True)


def launch_as_profile(prof: Any, launch_model: str | None, endpoint: Any, instances: int, *, vllm_python: Any,
                      log_dir: Any, port_base: int, cpus_per_instance: int | None = None,
                      api_server_cores: str = "client") -> Any:
    """The live instances: ``--launch`` started as the profile's engine is configured, else ``--endpoint``s."""
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
