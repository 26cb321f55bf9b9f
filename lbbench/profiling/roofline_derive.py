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

:func:`derive_roofline_profile` makes a whole profile of it: the engine's limits (:class:`EngineLimits`; vLLM V1's
defaults on the GPU where not given, the V0 engine on request), KV blocks as vLLM's memory profiler sizes them, and
``[step]``'s linear summary of the roofline. ``lbbench profile derive`` (:mod:`lbbench.profiling.derive`) calls it
with a calibration's factors; ``lbbench fidelity --measured`` with a measured row's engine settings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import InputError
from ..roofline import RooflineEfficiency, RooflineShape, RooflineStepModel
from .gpus import GPU
from .models import DTYPE_BYTES, ModelConfig

#: attention and activations run in 16 bits whatever the weights are
ACT_DTYPE = "bf16"
GIB = 1024 ** 3

#: vLLM V1's defaults where a limit is not given: the OpenAI server's batch defaults
#: (vllm/engine/arg_utils.py EngineArgs.get_batch_defaults): 8,192 tokens and 1,024 sequences on a GPU of 70 GiB or
#: more that is not an A100 (H100, H200, MI300X), else 2,048 tokens and 256 sequences; memory utilization 0.9
V1_LARGE_GPU = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}
V1_OTHER_GPU = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}
V1_GPU_MEMORY_UTILIZATION = 0.9
#: vLLM V0's ``max_num_seqs`` default (its token budget without chunked prefill: at least ``max_model_len``)
V0_MAX_NUM_SEQS = 256


class DeriveError(InputError):
    """Settings that cannot give a working instance (e.g. the model does not fit)."""


def v1_defaults(gpu: GPU) -> dict[str, int]:
    """vLLM V1's ``max_num_seqs`` and ``max_num_batched_tokens`` on ``gpu`` when the server is not told."""
    return V1_LARGE_GPU if gpu.memory_gib >= 70 and not gpu.name.startswith("a100") else V1_OTHER_GPU


def activation_peak_bytes(model: ModelConfig, dtype: str, tp: int, num_tokens: int, num_seqs: int) -> float:
    """Peak activation memory of vLLM's profiling forward pass (an estimate): per token the gated-MLP
    intermediates (gate+up and the activation), three hidden-size buffers (residual, normed, output) and
    q/k/v; plus fp32 logits and probabilities for ``num_seqs`` sampled sequences."""
    b = DTYPE_BYTES[dtype]
    qkv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim / tp
    per_token = b * (3 * model.intermediate_size / tp + 3 * model.hidden_size + qkv)
    sampler = num_seqs * model.vocab_size * 4 * 2
    return num_tokens * per_token + sampler


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
        memory_bw_bytes_s=gpu.memory_bw_bytes_s, link_bytes_s=gpu.link_bytes_s, fp8_gemms=1.0 if fp8_cores else 0.0)


# ---------------------------------------------------------------------------------------------- whole profiles
@dataclass(frozen=True)
class EngineLimits:
    """What an engine was (or will be) launched with; None: vLLM's default for the setting."""

    #: None: vLLM V1's default on the GPU (``v1_defaults``), or V0's 256
    max_num_seqs: int | None = None
    #: None: with chunked prefill vLLM V1's default on the GPU (``v1_defaults``); without, as vLLM sets it,
    #: ``max(max_model_len, 2048)``
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # None: min(the model's context, 8192)
    gpu_memory_utilization: float = V1_GPU_MEMORY_UTILIZATION
    long_prefill_token_threshold: int = 0
    #: vLLM V1's async scheduling (on by default from vLLM 0.12: vllm-project/vllm pull request #27614)
    async_scheduling: bool = False
    enable_prefix_caching: bool = False
    block_size: int = 16
    #: KV blocks the engine reported (``gpu_kv_blocks``); None: sized as vLLM's memory profiler does
    num_gpu_blocks: int | None = None
    #: vLLM's CPU KV offloading (``--kv-offloading-size`` GiB per GPU; 0: none): a CPU tier of that many GiB of
    #: blocks, loaded over the GPU's host link (``lbbench.sim.offload``)
    cpu_offload_gib: float = 0.0
    #: vLLM V1 runs chunked prefill unless told otherwise
    chunked_prefill: bool = True
    #: the simulator's engine semantics: "v1" (one mixed step, running requests first) or "v0" (vLLM V0 without
    #: chunked prefill: a step prefills waiting requests only, decodes pause)
    scheduler: str = "v1"

    def resolved(self, model: ModelConfig, gpu: GPU) -> "EngineLimits":
        """Every None replaced by the default vLLM would use for ``model`` on ``gpu``; DeriveError when the
        limits cannot start an engine."""
        if self.scheduler not in ("v1", "v0"):
            raise DeriveError(f"engine scheduler {self.scheduler!r}: choose v1 or v0")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise DeriveError("gpu_memory_utilization must be in (0, 1]")
        v1 = self.scheduler == "v1"
        max_model_len = self.max_model_len or min(model.max_position_embeddings, 8192)
        seqs = self.max_num_seqs or (v1_defaults(gpu)["max_num_seqs"] if v1 else V0_MAX_NUM_SEQS)
        mnbt = self.max_num_batched_tokens or (
            v1_defaults(gpu)["max_num_batched_tokens"] if self.chunked_prefill else max(max_model_len, 2048))
        if not self.chunked_prefill and mnbt < max_model_len:
            raise DeriveError(f"without chunked prefill max_num_batched_tokens ({mnbt}) must be >= max_model_len "
                              f"({max_model_len}), as vLLM requires")
        if mnbt < seqs:
            raise DeriveError(f"max_num_batched_tokens ({mnbt}) must be >= max_num_seqs ({seqs}), as vLLM requires")
        return replace(self, max_num_seqs=seqs, max_num_batched_tokens=mnbt, max_model_len=max_model_len)


def _cpu_tier(engine: EngineLimits, shape: RooflineShape, gpu: GPU) -> dict[str, float]:
    """``[kv]``'s CPU tier: ``cpu_offload_gib`` of one GPU's blocks (a block holds that GPU's share of 16 tokens'
    KV, as vLLM's offloading connector sizes its CPU blocks: 8 GiB of Llama-4-Scout at TP 2 is 5,461 blocks), loaded
    over the GPU's host link. Empty without offloading; refused without prefix caching (the tier finds blocks by
    their prefix hashes)."""
    if engine.cpu_offload_gib <= 0:
        return {}
    if not engine.enable_prefix_caching:
        raise DeriveError("cpu_offload_gib: vLLM's CPU KV tier finds blocks by their prefix hashes; turn prefix "
                          "caching on")
    if gpu.host_link_bytes_s <= 0:
        raise DeriveError(f"gpu {gpu.name}: no host link bandwidth in the GPU table for CPU KV offload")
    per_block = shape.kv_bytes_per_token * engine.block_size
    return {"cpu_offload_blocks": int(engine.cpu_offload_gib * 2 ** 30 // per_block),
            "kv_bytes_per_block": float(per_block), "cpu_link_bytes_s": gpu.host_link_bytes_s}



def weights_bytes_per_gpu(model: ModelConfig, weights_dtype: str, tp: int) -> float:
    """Every weight one GPU holds: the blocks in the weights' dtype, embeddings and LM head in 16 bits."""
    wb = DTYPE_BYTES[weights_dtype]
    blocks = model.block_params if model.is_moe else model.num_layers * model.params_per_layer
    other = model.embedding_params + model.lm_head_params + model.hidden_size
    return (blocks * wb + other * DTYPE_BYTES[ACT_DTYPE]) / tp


def derive_roofline_profile(model: ModelConfig, gpu: GPU, *, tp: int = 1, weights_dtype: str = "bf16",
                            kv_dtype: str = "auto", engine: EngineLimits = EngineLimits(),
                            eff: RooflineEfficiency = RooflineEfficiency(), eff_source: str = "",
                            api_overhead_s: float = 0.0, name: str | None = None) -> dict:
    """A vLLM profile (V1 with chunked prefill unless ``engine`` says otherwise) whose step times come from the
    roofline, as a TOML-ready dict.

    KV blocks: ``engine.num_gpu_blocks`` when the engine reported them, else vLLM's profiler estimate (memory x
    utilization, less the weights and the activation peak of a ``max_num_batched_tokens`` forward pass; the CUDA
    context not charged)."""
    if weights_dtype not in DTYPE_BYTES:
        raise DeriveError(f"weights dtype {weights_dtype!r}: choose from {', '.join(DTYPE_BYTES)}")
    if kv_dtype not in ("auto", "bf16", "fp16", "fp8"):
        raise DeriveError(f"kv dtype {kv_dtype!r}: choose from auto, bf16, fp16, fp8")
    if tp < 1:
        raise DeriveError("tensor parallel size must be >= 1")
    eff.check()
    engine = engine.resolved(model, gpu)
    seqs, mnbt, max_model_len = engine.max_num_seqs, engine.max_num_batched_tokens, engine.max_model_len
    assert seqs is not None and mnbt is not None and max_model_len is not None
    shape = roofline_shape(model, gpu, tp=tp, weights_dtype=weights_dtype, kv_dtype=kv_dtype)
    step = RooflineStepModel(shape, eff)
    w_bytes = weights_bytes_per_gpu(model, weights_dtype, tp)
    if engine.num_gpu_blocks:
        num_blocks = int(engine.num_gpu_blocks)
        kv_note = f"{num_blocks} blocks as the engine reported them"
    else:
        act = activation_peak_bytes(model, ACT_DTYPE, tp, mnbt, seqs)
        budget = gpu.memory_gib * GIB * engine.gpu_memory_utilization
        kv_bytes = budget - w_bytes - act
        if kv_bytes <= 0:
            raise DeriveError(f"{model.name} ({weights_dtype}, TP {tp}) does not fit on {gpu.name}: weights "
                              f"{w_bytes / GIB:.2f} GiB + activations {act / GIB:.2f} GiB exceed {budget / GIB:.2f} "
                              "GiB (memory x utilization); raise the tensor parallelism (tp) or use a larger GPU")
        num_blocks = int(kv_bytes // (shape.kv_bytes_per_token * engine.block_size))
        if num_blocks * engine.block_size < max_model_len:
            raise DeriveError(f"max_model_len {max_model_len} exceeds the {num_blocks * engine.block_size} tokens "
                              "the KV cache holds (vLLM refuses to start); lower the max_model_len")
        kv_note = (f"as vLLM's profiler: {gpu.memory_gib:g} GiB x {engine.gpu_memory_utilization:g}, less "
                   f"{w_bytes / GIB:.2f} GiB of weights and {act / GIB:.2f} GiB activation peak ({mnbt} tokens, "
                   f"{seqs} sampled sequences); CUDA context not charged; {kv_bytes / GIB:.2f} GiB / "
                   f"{shape.kv_bytes_per_token * engine.block_size / 1024 ** 2:.3f} MiB per block")
    # the linear summary: what [step] shows and the paper's mixing estimator reads
    batch = np.arange(1, seqs + 1, dtype=np.float64)
    dec = np.array([step.decode_s(int(b)) for b in batch])
    slope = float(np.polyfit(batch, dec, 1)[0]) if seqs > 1 else 0.0
    base = float(dec[0] - slope)
    p = min(1024, mnbt)
    per_prefill_token = step.prefill_s([(0, p)], 0) / p
    pname = name or f"{model.name}-{gpu.name}" + (f"-tp{tp}" if tp > 1 else "") + (
        "-fp8" if weights_dtype == "fp8" else "")
    mode = f"{engine.scheduler} scheduler, chunked prefill {'on' if engine.chunked_prefill else 'off'}"
    return {
        "name": pname,
        "description": f"{model.name} {weights_dtype} weights, KV {kv_dtype}, on {tp} x {gpu.description} under vLLM "
                       f"({mode}), roofline step model",
        "model": model.hf_id or model.name,
        "hardware": f"{tp} x {gpu.description}" if tp > 1 else gpu.description,
        "step": {"model": "roofline", "base_s": round(base, 7), "prefill_token_s": float(f"{per_prefill_token:.4g}"),
                 "decode_seq_s": float(f"{max(slope, 0.0):.4g}"),
                 "context_token_s": float(f"{step.context_token_s:.4g}"), "api_overhead_s": api_overhead_s},
        "roofline": shape.as_dict(),
        "efficiency": eff.as_dict(),
        "kv": {"num_kv_blocks": num_blocks, "block_size": engine.block_size,
               "enable_prefix_caching": engine.enable_prefix_caching, **_cpu_tier(engine, shape, gpu)},
        "engine": {"max_num_seqs": seqs, "max_num_batched_tokens": mnbt,
                   "max_model_len": max_model_len, "chunked_prefill": engine.chunked_prefill,
                   "scheduler": engine.scheduler,
                   "long_prefill_token_threshold": engine.long_prefill_token_threshold,
                   "async_scheduling": engine.async_scheduling},
        "mixing": {"grad1": float(f"{per_prefill_token:.4g}"), "grad2": float(f"{max(slope, 1e-9):.4g}"),
                   "epsilon": 0.05, "alpha": 0.5, "min_step_s": round(step.decode_s(1), 7)},
        "physics": {"model_config": model.name, "gpu": gpu.name, "dtype": weights_dtype, "kv_dtype": kv_dtype,
                    "tp": tp},
        "source": {
            "method": "lbbench.profiling.roofline_derive: the roofline of lbbench.roofline over the model config and "
                      "the GPU table; [step]'s linear coefficients only summarize it (least-squares slope of "
                      f"decode_s over batch 1..{seqs}; the prefill cost of a {p}-token prompt)",
            "efficiency": eff_source or "RooflineEfficiency's stated defaults (not fitted)",
            "num_kv_blocks": kv_note,
            "engine": f"max_num_seqs {seqs}, max_num_batched_tokens {mnbt}, max_model_len {max_model_len}, {mode}"
                      + "; limits not given are vLLM's defaults (V1: vllm/engine/arg_utils.py "
                        "EngineArgs.get_batch_defaults)",
            "gpu": "; ".join(f"{k}: {v}" for k, v in gpu.sources.items()) + (f"; link: {gpu.link}" if gpu.link else ""),
        },
    }
