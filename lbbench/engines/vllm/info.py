"""What a running vLLM server says of itself: model, version, KV cache (blocks and block size), limits.

Read from ``/version``, ``/v1/models`` and the ``vllm:cache_config_info`` metric. Live runs give routers the KV
capacity the engine reports (``lbbench.experiment.backends.live_spec``); ``lbbench profile measure`` starts
from it.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from ...errors import SetupError
from . import VLLM


class EngineInfoError(SetupError):
    """The URL is not a vLLM server that says what ``engine_info`` reads (the message says what is missing)."""


@dataclass
class EngineInfo:
    url: str
    model: str
    version: str
    block_size: int
    num_blocks: int
    max_model_len: int
    prefix_caching: bool | None


def _get(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return resp.read().decode()


_LABEL = re.compile(r'(\w+)="([^"]*)"')


def engine_info(url: str) -> EngineInfo:
    """What the engine at ``url`` says of itself; ``EngineInfoError`` when it is not a vLLM server."""
    url = url.rstrip("/")
    try:
        version = json.loads(_get(url + "/version")).get("version", "")
        models = json.loads(_get(url + "/v1/models"))["data"]
        metrics = _get(url + "/metrics")
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineInfoError(f"{url}: not a vLLM server (/version, /v1/models or /metrics failed: {exc})") from None
    line = next((x for x in metrics.splitlines() if x.startswith(VLLM.cache_config_info + "{")), None)
    if not version or line is None or not models:
        raise EngineInfoError(f"{url}: not a vLLM server (no version, models or vllm:cache_config_info metric)")
    labels = dict(_LABEL.findall(line))
    try:
        block_size = int(labels["block_size"])
        num_blocks = int(labels["num_gpu_blocks"])
    except (KeyError, ValueError):
        raise EngineInfoError(f"{url}: vllm:cache_config_info lacks block_size/num_gpu_blocks") from None
    pc = labels.get("enable_prefix_caching")
    return EngineInfo(url=url, model=models[0]["id"], version=version, block_size=block_size,
                      num_blocks=num_blocks, max_model_len=int(models[0].get("max_model_len") or 0),
                      prefix_caching=None if pc is None else pc == "True")
