"""What importers and checks need to know of a model: its config file, the dtype vLLM loads it in, KV bytes.

A model is named by its Hugging Face id (``meta-llama/Llama-2-7b-hf``). Its ``config.json`` is looked up, in order,

1. in the directories given (``--model-configs DIR``): ``<name>.json`` (the id's last part in lower case, e.g.
   ``llama-2-7b-hf.json``, as in ``../shared/gpu-measurements/model-configs/``), ``<Name>/config.json`` (a
   checkpoint-style tree), or any ``*.json`` whose ``_name_or_path`` is the id;
2. among lbbench's shipped configs (``lbbench.profiling.models``), by their ``_name_or_path``.

The architecture is read by ``lbbench.profiling.models.load_model_config``, the same reader profile derivation
uses; a config it cannot read yet (a new architecture) leaves what depends on it unknown, with the reason.

**Weight dtype** follows vLLM's ``--dtype auto`` (``vllm/config/model.py``, the ``--dtype`` help: "FP16 for FP32
and FP16 models, BF16 for BF16 models"): ``torch_dtype`` ``float16`` -> ``fp16``, ``bfloat16`` -> ``bf16``; a
quantized checkpoint (``quantization_config``) takes the dtype lbbench's reader finds for it, else stays unknown;
``float32`` stays unknown (vLLM's choice for it has changed between versions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..profiling.models import ModelConfigError, load_model_config, shipped_models

TORCH_DTYPES = {"float16": "fp16", "bfloat16": "bf16"}


def _slug(model_id: str) -> str:
    return model_id.rstrip("/").split("/")[-1].lower()


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class ModelFacts:
    """Model configs found through ``dirs`` and lbbench's shipped ones (see the module docstring)."""

    dirs: tuple[Path, ...] = ()
    _paths: dict[str, Path | None] = field(default_factory=dict, repr=False)
    _configs: dict[str, tuple[Any, str]] = field(default_factory=dict, repr=False)

    def config_path(self, model_id: str) -> Path | None:
        """The ``config.json`` of ``model_id``, or None when none is found."""
        if model_id not in self._paths:
            self._paths[model_id] = self._find(model_id)
        return self._paths[model_id]

    def _find(self, model_id: str) -> Path | None:
        slug = _slug(model_id)
        for d in self.dirs:
            d = Path(d)
            if not d.is_dir():
                continue
            direct = d / f"{slug}.json"
            if direct.is_file():
                return direct
            for sub in sorted(d.iterdir()):
                if sub.is_dir() and sub.name.lower() == slug and (sub / "config.json").is_file():
                    return sub / "config.json"
            for p in sorted(d.glob("*.json")):
                data = _read_json(p)
                if data and data.get("_name_or_path") == model_id:
                    return p
        for p in shipped_models().values():
            data = _read_json(p)
            if data and data.get("_name_or_path") == model_id:
                return p
        return None

    def raw(self, model_id: str) -> dict[str, Any] | None:
        """The config file's JSON, or None."""
        p = self.config_path(model_id)
        return None if p is None else _read_json(p)

    def config(self, model_id: str) -> tuple[Any, str]:
        """(``ModelConfig``, "") as ``lbbench.profiling.models`` reads it, or (None, the reason it cannot)."""
        if model_id not in self._configs:
            p = self.config_path(model_id)
            if p is None:
                found: tuple[Any, str] = (None, f"no config.json for {model_id} (give --model-configs DIR)")
            else:
                try:
                    found = (load_model_config(p), "")
                except ModelConfigError as exc:
                    found = (None, f"lbbench.profiling.models cannot read it yet ({exc})")
            self._configs[model_id] = found
        return self._configs[model_id]

    def weights_dtype(self, model_id: str) -> str | None:
        """The dtype vLLM's ``--dtype auto`` loads the weights in (module docstring), or None when unknown."""
        data = self.raw(model_id)
        if data is None:
            return None
        if "quantization_config" in data:
            cfg, _ = self.config(model_id)
            return getattr(cfg, "weights_dtype", "") or None
        text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
        return TORCH_DTYPES.get(str(data.get("torch_dtype") or text.get("torch_dtype") or ""))

    def kv_bytes_per_token_per_gpu(self, model_id: str, kv_dtype: str | None, tp: int) -> float | None:
        """K and V bytes one token holds on one of ``tp`` GPUs (KV heads split across them, replicated when
        fewer than ``tp``); ``kv_dtype`` ``auto``/empty is the 2-byte model dtype. None when the config is
        unknown."""
        cfg, _ = self.config(model_id)
        if cfg is None:
            return None
        dtype = "fp8" if kv_dtype and kv_dtype.startswith("fp8") else "fp16"
        per_head = cfg.kv_bytes_per_token(dtype) / cfg.num_kv_heads
        return per_head * max(cfg.num_kv_heads / tp, 1.0)
