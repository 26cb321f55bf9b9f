"""Model architectures for deriving profiles: a Hugging Face ``config.json`` read into counts that set cost.

Only the architecture fields are needed (no weights): layers, hidden size, attention and KV heads, MLP
width, vocabulary, and for mixture-of-experts models the experts. From them come the parameter count, the bytes
of weights, the KV-cache bytes per token and the floating-point work per token. Decoder-only transformers with a
gated (SwiGLU) MLP are supported: the Llama, Mistral, Qwen2 / Qwen3 and Yi families (dense), and Mixtral and
Llama 4 (mixture of experts: ``num_local_experts`` routed experts of which ``num_experts_per_tok`` run per token,
Llama 4's shared expert, and ``interleave_moe_layer_step`` when only every k-th layer is MoE). A multimodal
config's ``text_config`` is read (the vision tower is not served by a text workload). A ``quantization_config``
with 8-bit float weights (``compressed-tensors``, ``fp8``, ``fbgemm_fp8``) sets ``weights_dtype = "fp8"``.
Configs for common models ship in ``models/``.
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
    #: mixture of experts (0: a dense model): routed experts per MoE layer and how many run per token
    num_experts: int = 0
    num_experts_per_tok: int = 0
    #: MLP width of one routed expert, and of the shared expert every MoE layer also runs (0: none)
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    #: layers whose MLP is MoE (the others run a dense MLP of ``intermediate_size``)
    num_moe_layers: int = 0
    #: the dtype the weights ship in when the checkpoint is quantized ("fp8"), else "" (the serving dtype)
    weights_dtype: str = ""

    # ------------------------------------------------------------------ structure
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_params_per_layer(self) -> int:
        """Q, K, V (and their bias) and the output projection, plus the two RMS norms."""
        h, hd = self.hidden_size, self.head_dim
        q = h * self.num_heads * hd
        kv = 2 * h * self.num_kv_heads * hd
        o = self.num_heads * hd * h
        bias = (self.num_heads + 2 * self.num_kv_heads) * hd if self.qkv_bias else 0
        return q + kv + o + bias + 2 * h

    @property
    def dense_mlp_params(self) -> int:
        """A dense layer's gated MLP: gate, up, down."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        """One routed expert's gated MLP."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def moe_layer_fixed_params(self) -> int:
        """What every token of an MoE layer runs besides its routed experts: the router and the shared expert."""
        return self.hidden_size * self.num_experts + 3 * self.hidden_size * self.shared_expert_intermediate_size

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def block_params(self) -> int:
        """Weights of every transformer block together (all experts included)."""
        dense = self.num_dense_layers * (self.attention_params_per_layer + self.dense_mlp_params)
        moe = self.num_moe_layers * (self.attention_params_per_layer + self.moe_layer_fixed_params
                                     + self.num_experts * self.expert_params)
        return dense + moe

    @property
    def active_block_params(self) -> int:
        """Weights of the blocks one token multiplies: its ``num_experts_per_tok`` experts only."""
        dense = self.num_dense_layers * (self.attention_params_per_layer + self.dense_mlp_params)
        moe = self.num_moe_layers * (self.attention_params_per_layer + self.moe_layer_fixed_params
                                     + self.num_experts_per_tok * self.expert_params)
        return dense + moe

    def experts_touched(self, num_tokens: float) -> float:
        """Expected distinct routed experts a batch of ``num_tokens`` tokens runs in one MoE layer, each token
        picking ``num_experts_per_tok`` of ``num_experts`` uniformly: ``E (1 - (1 - k / E) ** T)`` (routing
        assumed uniform and independent across tokens; real routers are skewed, which touches fewer)."""
        if not self.is_moe or num_tokens <= 0:
            return 0.0
        e, k = self.num_experts, self.num_experts_per_tok
        return e * (1.0 - (1.0 - k / e) ** num_tokens)

    # ------------------------------------------------------------------ parameters
    @property
    def params_per_layer(self) -> int:
        """Weights of one block, averaged over the blocks (a dense model's blocks are all alike)."""
        if not self.is_moe:
            return self.attention_params_per_layer + self.dense_mlp_params
        return self.block_params // self.num_layers

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Every parameter held in memory."""
        blocks = self.block_params if self.is_moe else self.num_layers * self.params_per_layer
        return blocks + self.embedding_params + self.lm_head_params + self.hidden_size

    @property
    def params_read_per_step(self) -> int:
        """Parameters a decode step streams from memory: all but the embedding table, of which only the
        looked-up rows are read (a tied table is read whole, as the output projection)."""
        blocks = self.block_params if self.is_moe else self.num_layers * self.params_per_layer
        return blocks + self.hidden_size + self.vocab_size * self.hidden_size

    # ------------------------------------------------------------------ work and memory per token
    def kv_bytes_per_token(self, dtype: str) -> int:
        """KV-cache bytes one token holds: K and V for every layer and KV head."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[dtype]

    def prefill_flops_per_token(self, mean_context_tokens: float) -> float:
        """Floating-point operations to prefill one prompt token: 2 per weight of every transformer block
        (the output projection runs only on a sequence's last token, so it is left out), plus attention
        scores and the weighted sum over ``mean_context_tokens`` earlier tokens (4 per head dimension)."""
        matmul = 2.0 * (self.active_block_params if self.is_moe else self.num_layers * self.params_per_layer)
        attention = 4.0 * self.num_layers * self.num_heads * self.head_dim * mean_context_tokens
        return matmul + attention

    @property
    def decode_flops_per_seq(self) -> float:
        """Operations per decoding sequence per step, context aside: every block and the output projection."""
        blocks = self.active_block_params if self.is_moe else self.num_layers * self.params_per_layer
        return 2.0 * (blocks + self.vocab_size * self.hidden_size)


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
    top = data
    if isinstance(data.get("text_config"), dict):  # a multimodal checkpoint: serve its language model
        data = {**data["text_config"], "_name_or_path": top.get("_name_or_path", "")}
    for key in REQUIRED_FIELDS:
        if key not in data:
            raise ModelConfigError(f"{p}: missing field {key!r}")
    try:
        h = int(data["hidden_size"])
        heads = int(data["num_attention_heads"])
        kv = int(data.get("num_key_value_heads") or heads)
        moe = _moe_fields(data)
        cfg = ModelConfig(
            name=p.stem if p.name != "config.json" else p.parent.name,
            hidden_size=h, intermediate_size=int(moe.pop("intermediate_size", data["intermediate_size"])),
            num_layers=int(data["num_hidden_layers"]), num_heads=heads, num_kv_heads=kv,
            head_dim=int(data.get("head_dim") or h // heads), vocab_size=int(data["vocab_size"]),
            max_position_embeddings=int(data.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            qkv_bias=bool(data.get("attention_bias", data.get("model_type") == "qwen2")),
            hf_id=str(data.get("_name_or_path") or ""),
            **moe, weights_dtype=_weights_dtype(top),
        )
    except (TypeError, ValueError) as exc:
        raise ModelConfigError(f"{p}: a size field is not an integer: {exc}") from None
    for field in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size"):
        if getattr(cfg, field) <= 0:
            raise ModelConfigError(f"{p}: {field} must be positive")
    if cfg.is_moe and not 0 < cfg.num_experts_per_tok <= cfg.num_experts:
        raise ModelConfigError(f"{p}: num_experts_per_tok {cfg.num_experts_per_tok} must be in 1..num_local_experts "
                               f"{cfg.num_experts}")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ModelConfigError(f"{p}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    return cfg


def _moe_fields(data: dict) -> dict:
    """MoE fields of a Mixtral- or Llama-4-style config (``num_local_experts``); empty for a dense model."""
    experts = int(data.get("num_local_experts") or data.get("num_experts") or 0)
    if not experts:
        return {}
    layers = int(data["num_hidden_layers"])
    step = int(data.get("interleave_moe_layer_step") or 1)
    model_type = str(data.get("model_type", ""))
    if model_type.startswith("llama4"):
        # Llama 4: routed experts of ``intermediate_size`` plus one shared expert of the same width on every MoE
        # layer; the dense layers (when step > 1) use ``intermediate_size_mlp``
        expert = int(data["intermediate_size"])
        return {"num_experts": experts, "num_experts_per_tok": int(data.get("num_experts_per_tok") or 1),
                "moe_intermediate_size": expert, "shared_expert_intermediate_size": expert,
                "num_moe_layers": layers // step,
                "intermediate_size": int(data.get("intermediate_size_mlp") or expert)}
    return {"num_experts": experts, "num_experts_per_tok": int(data.get("num_experts_per_tok") or 2),
            "moe_intermediate_size": int(data.get("moe_intermediate_size") or data["intermediate_size"]),
            "shared_expert_intermediate_size": int(data.get("shared_expert_intermediate_size") or 0),
            "num_moe_layers": layers // step}


def _weights_dtype(data: dict) -> str:
    """"fp8" when the checkpoint's ``quantization_config`` stores 8-bit float weights, else ""."""
    q = data.get("quantization_config")
    if not isinstance(q, dict):
        return ""
    method = str(q.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8"
    for group in (q.get("config_groups") or {}).values():
        w = group.get("weights") or {} if isinstance(group, dict) else {}
        if w.get("num_bits") == 8 and w.get("type") == "float":
            return "fp8"
    return ""
