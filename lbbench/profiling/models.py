"""Model architectures for deriving profiles: a Hugging Face ``config.json`` read into counts that set cost.

Only the architecture fields are needed (no weights): layers, hidden size, attention and KV heads, MLP
width, vocabulary. From them come the parameter count, the bytes of weights, the KV-cache bytes per token
and the floating-point work per prefill token. Dense decoder-only transformers with a gated (SwiGLU) MLP are
supported: the Llama, Mistral and Qwen2 families. Configs for common models ship in ``models/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

MODELS_DIR = Path(__file__).resolve().parent / "models"

#: fields a config must have; the error names the first one missing
REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


class ModelConfigError(InputError):
    """A model config that cannot be used (the message names the file and the field)."""


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    hf_id: str = ""  # the hub id (``_name_or_path``), used as the served model name

    # ------------------------------------------------------------------ parameters
    @property
    def params_per_layer(self) -> int:
        h, hd = self.hidden_size, self.head_dim
        q = h * self.num_heads * hd
        kv = 2 * h * self.num_kv_heads * hd
        o = self.num_heads * hd * h
        bias = (self.num_heads + 2 * self.num_kv_heads) * hd if self.qkv_bias else 0
        mlp = 3 * h * self.intermediate_size  # gate, up, down
        norms = 2 * h
        return q + kv + o + bias + mlp + norms

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Every parameter held in memory."""
        return (self.num_layers * self.params_per_layer + self.embedding_params + self.lm_head_params
                + self.hidden_size)

    @property
    def params_read_per_step(self) -> int:
        """Parameters a decode step streams from memory: all but the embedding table, of which only the
        looked-up rows are read (a tied table is read whole, as the output projection)."""
        read = self.num_layers * self.params_per_layer + self.hidden_size + self.vocab_size * self.hidden_size
        return read

    # ------------------------------------------------------------------ work and memory per token
    def kv_bytes_per_token(self, dtype: str) -> int:
        """KV-cache bytes one token holds: K and V for every layer and KV head."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[dtype]

    def prefill_flops_per_token(self, mean_context_tokens: float) -> float:
        """Floating-point operations to prefill one prompt token: 2 per weight of every transformer block
        (the output projection runs only on a sequence's last token, so it is left out), plus attention
        scores and the weighted sum over ``mean_context_tokens`` earlier tokens (4 per head dimension)."""
        matmul = 2.0 * self.num_layers * self.params_per_layer
        attention = 4.0 * self.num_layers * self.num_heads * self.head_dim * mean_context_tokens
        return matmul + attention

    @property
    def decode_flops_per_seq(self) -> float:
        """Operations per decoding sequence per step, context aside: every block and the output projection."""
        return 2.0 * (self.num_layers * self.params_per_layer + self.vocab_size * self.hidden_size)


def shipped_models() -> dict[str, Path]:
    return {p.stem: p for p in sorted(MODELS_DIR.glob("*.json"))}


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """A shipped config by name (``llama-3.1-8b``) or a ``config.json`` path (or a directory holding one)."""
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        found = shipped_models().get(str(name_or_path))
        if found is None:
            raise ModelConfigError(f"model {str(name_or_path)!r}: no such file, and not a shipped config "
                                   f"(shipped: {', '.join(shipped_models())})")
        p = found
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ModelConfigError(f"{p}: not a readable JSON model config: {exc}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{p}: a model config must be a JSON object")
    for key in REQUIRED_FIELDS:
        if key not in data:
            raise ModelConfigError(f"{p}: missing field {key!r}")
    try:
        h = int(data["hidden_size"])
        heads = int(data["num_attention_heads"])
        kv = int(data.get("num_key_value_heads") or heads)
        cfg = ModelConfig(
            name=p.stem if p.name != "config.json" else p.parent.name,
            hidden_size=h, intermediate_size=int(data["intermediate_size"]),
            num_layers=int(data["num_hidden_layers"]), num_heads=heads, num_kv_heads=kv,
            head_dim=int(data.get("head_dim") or h // heads), vocab_size=int(data["vocab_size"]),
            max_position_embeddings=int(data.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            qkv_bias=bool(data.get("attention_bias", data.get("model_type") == "qwen2")),
            hf_id=str(data.get("_name_or_path") or ""),
        )
    except (TypeError, ValueError) as exc:
        raise ModelConfigError(f"{p}: a size field is not an integer: {exc}") from None
    for field in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size"):
        if getattr(cfg, field) <= 0:
            raise ModelConfigError(f"{p}: {field} must be positive")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ModelConfigError(f"{p}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    return cfg
