"""The ``[roofline]`` table of a profile from a model config, a GPU, tensor parallelism and dtypes.

What one GPU of a tensor-parallel group handles per layer (vLLM's sharding): the query and output projections and
the MLP are split ``TP`` ways; K and V heads are split too, but never below one head per GPU (with more GPUs than
KV heads each GPU keeps a copy, as vLLM replicates them); a mixture-of-experts layer keeps every expert on every
GPU with its MLP width split ``TP`` ways (tensor-parallel experts, vLLM's default without expert parallelism),
while the router is replicated; the LM head is split over the vocabulary. Weight bytes follow the weights' dtype
(FP8: one byte); the LM head stays in 16 bits (quantized checkpoints keep it so). FP8 weights run on the FP8
tensor-core peak where the GPU has one, else as weight-only FP8 on the 16-bit peak (A100, V100).

Elementwise traffic per token and layer, as vLLM's fused kernels move it in 16 bits: two fused add-RMS-norms
(each reads the hidden state and the residual and writes both: ``8 x hidden``), SiLU-and-multiply (reads the
gate and up halves, writes one: ``3 x`` the MLP width on this GPU; for an MoE layer the ``k`` experts' and the
shared expert's widths), rotary embedding (reads and writes Q and K: ``2 x (heads + KV heads) x head_dim``).
"""

from __future__ import annotations

from ..roofline import RooflineShape
from .gpus import GPU
from .models import DTYPE_BYTES, ModelConfig

#: attention and activations run in 16 bits whatever the weights are
ACT_DTYPE = "bf16"


def _peak16(gpu: GPU) -> float:
    return gpu.peak_flops.get("bf16") or gpu.peak("fp16")


def roofline_shape(model: ModelConfig, gpu: GPU, *, tp: int = 1, weights_dtype: str = "bf16",
                   kv_dtype: str = "auto") -> RooflineShape:
    """``kv_dtype`` ``auto``: the KV cache in the activations' 16 bits; ``fp8``: one byte per element."""
    wb = DTYPE_BYTES[weights_dtype]
    kvb = 2 if kv_dtype in ("auto", "bf16", "fp16") else DTYPE_BYTES[kv_dtype]
    h, hd = model.hidden_size, model.head_dim
    kv_heads = max(1, model.num_kv_heads // tp)
    q_params = h * model.num_heads * hd / tp
    kv_params = 2 * h * kv_heads * hd
    o_params = model.num_heads * hd * h / tp
    bias = ((model.num_heads / tp + 2 * kv_heads) * hd) if model.qkv_bias else 0
    attn_params = q_params + kv_params + o_params + bias
    mlp_params = 3 * h * model.intermediate_size / tp
    moe_fixed_params = (h * model.num_experts + 3 * h * model.shared_expert_intermediate_size / tp
                        if model.is_moe else 0.0)
    expert_params = model.expert_params / tp if model.is_moe else 0.0
    lm_head_params = model.vocab_size * h / tp
    fp8_cores = weights_dtype == "fp8" and "fp8" in gpu.peak_flops
    dense_width = model.intermediate_size / tp
    moe_width = (model.num_experts_per_tok * model.moe_intermediate_size + model.shared_expert_intermediate_size) / tp
    rope = 2 * (model.num_heads / tp + kv_heads) * hd
    elem = (model.num_dense_layers * (8 * h + 3 * dense_width + rope)
            + model.num_moe_layers * (8 * h + 3 * moe_width + rope)) * DTYPE_BYTES[ACT_DTYPE]
    return RooflineShape(
        num_layers=model.num_layers, num_moe_layers=model.num_moe_layers, tp=tp, hidden_size=h,
        attn_bytes=attn_params * wb, attn_params=attn_params,
        mlp_bytes=mlp_params * wb, mlp_params=mlp_params,
        moe_fixed_bytes=moe_fixed_params * wb, moe_fixed_params=moe_fixed_params,
        num_experts=model.num_experts, num_experts_per_tok=model.num_experts_per_tok,
        expert_bytes=expert_params * wb, expert_params=expert_params,
        lm_head_bytes=lm_head_params * DTYPE_BYTES[ACT_DTYPE], lm_head_params=lm_head_params,
        kv_bytes_per_token=2 * model.num_layers * kv_heads * hd * kvb,
        attn_flops_per_token_pair=4.0 * model.num_layers * model.num_heads * hd / tp,
        elementwise_bytes_per_token=elem,
        peak_flops=gpu.peak("fp8") if fp8_cores else _peak16(gpu), attn_peak_flops=_peak16(gpu),
        memory_bw_bytes_s=gpu.memory_bw_bytes_s, link_bytes_s=gpu.link_bytes_s)
