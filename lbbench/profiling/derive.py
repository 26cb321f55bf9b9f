"""``lbbench profile derive``: a profile from first principles (model config x GPU table x engine settings).

Step-time coefficients come from a roofline with stated efficiency factors:

- ``prefill_token_s`` = prefill FLOPs per token / (``prefill_mfu`` x peak dense FLOP/s x TP);
- ``base_s`` = ``step_overhead_s`` + weight bytes streamed per step / (``weight_bw_util`` x bandwidth x TP);
- ``decode_seq_s``: least-squares slope, over batch sizes 1..``max_num_seqs``, of the time by which a decode
  step's roofline, the soft maximum of the weight read and ``B x FLOPs per sequence / (MFU x peak)`` with
  sharpness ``roofline_sharpness``, exceeds the weight read;
- ``context_token_s`` = KV bytes per token / (``kv_bw_util`` x bandwidth x TP).

By default ``prefill_mfu``, ``weight_bw_util`` and ``roofline_sharpness`` are the ones fitted to measured GPU
timings of transformer blocks' linear operations (:mod:`lbbench.profiling.efficiency`: Vidur's A100 files, per
tensor parallelism and model size; held out on its H100 files); the KV-read utilization and the step overhead
stay stated assumptions, since the files measure neither attention nor the engine.

KV blocks follow vLLM's memory profiler: ``memory x gpu_memory_utilization`` less the weights and the
activation peak of a profiling forward pass over ``max_num_batched_tokens`` tokens (plus the sampler's logits
for ``max_num_seqs`` sequences); the CUDA context is not charged. Tensor parallelism divides weights, FLOPs and
KV heads across GPUs; all-reduce time is not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from .efficiency import EfficiencyRow, load_table, select_row, soft_max
from .gpus import GPU
from .models import DTYPE_BYTES, ModelConfig

GIB = 1024 ** 3

#: prompt length at which the attention part of a prefill token's FLOPs is evaluated (mean context: half)
REFERENCE_PROMPT_TOKENS = 1024


class DeriveError(InputError):
    """Settings that cannot give a working instance (e.g. the model does not fit)."""


@dataclass(frozen=True)
class Efficiency:
    """The stated efficiency factors of the roofline (assumptions until measured on the GPU)."""

    #: share of peak dense FLOP/s that prefill GEMMs reach (serving engines reach ~0.4-0.6 on large batches)
    prefill_mfu: float = 0.5
    #: share of peak memory bandwidth reached streaming weights in a decode step
    weight_bw_util: float = 0.8
    #: share of peak bandwidth reached reading paged KV blocks in attention
    kv_bw_util: float = 0.5
    #: fixed per-step cost outside the GPU kernels' work (scheduler, sampler, launches), seconds
    step_overhead_s: float = 0.0015
    #: how abruptly the memory-bound regime hands over to the compute-bound one (inf: a hard max)
    roofline_sharpness: float = math.inf

    def check(self) -> None:
        if not 0 < self.prefill_mfu <= 0.8:
            raise DeriveError(f"prefill MFU {self.prefill_mfu} is outside (0, 0.8]")
        if not 0 < self.weight_bw_util <= 0.9 or not 0 < self.kv_bw_util <= 0.9:
            raise DeriveError("bandwidth utilizations must be in (0, 0.9]")
        if self.step_overhead_s < 0:
            raise DeriveError("step overhead must be >= 0")
        if not self.roofline_sharpness >= 1:
            raise DeriveError(f"roofline sharpness {self.roofline_sharpness} must be >= 1")


@dataclass(frozen=True)
class FittedEfficiency:
    """The efficiency factors fitted to measurements for one model x GPU x TP, and where they come from."""

    eff: Efficiency
    row: EfficiencyRow
    source: dict = field(default_factory=dict)

    def citation(self) -> str:
        src = self.source
        return (f"{src['repository']} (commit {src['commit'][:12]}, {src['licence']} licence), "
                f"{', '.join(self.row.files)}")


def fitted_efficiency(model: ModelConfig, gpu: GPU, tp: int = 1) -> FittedEfficiency:
    """Prefill MFU, weight-read bandwidth utilization and roofline sharpness fitted to measured block timings
    (the row of ``efficiency.toml`` for this TP nearest in per-GPU block weight size); the KV-read
    utilization and step overhead keep :class:`Efficiency`'s stated defaults."""
    table = load_table()
    row = select_row(table, gpu.name, tp, model.params_per_layer * 2 / tp)
    eff = Efficiency(prefill_mfu=row.prefill_mfu, weight_bw_util=row.weight_bw_util,
                     roofline_sharpness=row.sharpness)
    src = dict(table.source)
    held = [v for v in table.validation if v["tp"] == row.tp and v.get("group") == row.group]
    if held:
        src["held_out"] = "; ".join(
            f"{v['gpu']} {v['file'].split('/')[-2]} TP {v['tp']}: mean |error| {v['mean_abs_pct']:g} %, worst "
            f"{v['max_abs_pct']:g} % (at {v['max_at_tokens']} tokens), prefill marginal "
            f"{(v['marginal_pred_s'] / v['marginal_s'] - 1) * 100:+.1f} %" for v in held)
    return FittedEfficiency(eff=eff, row=row, source=src)


@dataclass(frozen=True)
class EngineSettings:
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: 8192 with chunked prefill, else max_model_len
    max_model_len: int | None = None  # None: min(model's max_position_embeddings, 8192)
    chunked_prefill: bool = True
    scheduler: str = "v1"
    block_size: int = 16
    gpu_memory_utilization: float = 0.9


def activation_peak_bytes(model: ModelConfig, dtype: str, tp: int, num_tokens: int, num_seqs: int) -> float:
    """Peak activation memory of vLLM's profiling forward pass (an estimate): per token the gated-MLP
    intermediates (gate+up and the activation), three hidden-size buffers (residual, normed, output) and
    q/k/v; plus fp32 logits and probabilities for ``num_seqs`` sampled sequences."""
    b = DTYPE_BYTES[dtype]
    qkv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim / tp
    per_token = b * (3 * model.intermediate_size / tp + 3 * model.hidden_size + qkv)
    sampler = num_seqs * model.vocab_size * 4 * 2
    return num_tokens * per_token + sampler


def derive_profile(model: ModelConfig, gpu: GPU, *, dtype: str = "bf16", tp: int = 1,
                   eff: Efficiency | None = None, engine: EngineSettings = EngineSettings(),
                   name: str | None = None, fitted: FittedEfficiency | None = None) -> dict:
    """The profile as a TOML-ready dict, every number with its ``[source]`` line.

    ``eff`` None: the factors fitted to measurements (:func:`fitted_efficiency`). ``fitted``: the fit to cite
    beside an ``eff`` that overrides some of its factors (those equal to the fit's are cited as fitted)."""
    if eff is None:
        fitted = fitted or fitted_efficiency(model, gpu, tp)
        eff = fitted.eff
    eff.check()
    if dtype not in DTYPE_BYTES:
        raise DeriveError(f"dtype {dtype!r}: choose from {', '.join(DTYPE_BYTES)}")
    if tp < 1:
        raise DeriveError("tensor parallel size must be >= 1")
    if engine.scheduler not in ("v1", "v0"):
        raise DeriveError(f"engine scheduler {engine.scheduler!r}: choose v1 or v0")
    if not 0 < engine.gpu_memory_utilization <= 1:
        raise DeriveError("gpu_memory_utilization must be in (0, 1]")
    peak = gpu.peak(dtype)
    bw = gpu.memory_bw_bytes_s
    nbytes = DTYPE_BYTES[dtype]
    max_model_len = engine.max_model_len or min(model.max_position_embeddings, 8192)
    mnbt = engine.max_num_batched_tokens or (8192 if engine.chunked_prefill else max_model_len)
    if not engine.chunked_prefill and mnbt < max_model_len:
        raise DeriveError(f"without chunked prefill max_num_batched_tokens ({mnbt}) must be >= max_model_len "
                          f"({max_model_len}), as vLLM requires")

    # prefill
    flops_tok = model.prefill_flops_per_token(REFERENCE_PROMPT_TOKENS / 2) / tp
    prefill_token_s = flops_tok / (eff.prefill_mfu * peak)
    # decode: weights streamed once per step, then compute grows with the batch
    read_bytes = model.params_read_per_step * nbytes / tp
    mem_s = read_bytes / (eff.weight_bw_util * bw)
    base_s = eff.step_overhead_s + mem_s
    per_seq_compute_s = model.decode_flops_per_seq / tp / (eff.prefill_mfu * peak)
    batch = np.arange(1, engine.max_num_seqs + 1, dtype=np.float64)
    excess = soft_max(mem_s, batch * per_seq_compute_s, eff.roofline_sharpness) - mem_s
    decode_seq_s = float(batch @ excess / (batch @ batch))
    kv_token_bytes = model.kv_bytes_per_token(dtype) * max(1, model.num_kv_heads // tp) / model.num_kv_heads
    context_token_s = kv_token_bytes / (eff.kv_bw_util * bw)

    # KV cache as vLLM's profiler sizes it
    weights_bytes = model.num_params * nbytes / tp
    act_bytes = activation_peak_bytes(model, dtype, tp, mnbt, engine.max_num_seqs)
    budget = gpu.memory_gib * GIB * engine.gpu_memory_utilization
    kv_bytes = budget - weights_bytes - act_bytes
    if kv_bytes <= 0:
        raise DeriveError(f"{model.name} ({dtype}, TP {tp}) does not fit on {gpu.name}: weights "
                          f"{weights_bytes / GIB:.2f} GiB + activations {act_bytes / GIB:.2f} GiB exceed "
                          f"{budget / GIB:.2f} GiB (memory x utilization); raise the tensor parallelism (tp) or use a larger GPU")
    num_blocks = int(kv_bytes // (kv_token_bytes * engine.block_size))
    if num_blocks * engine.block_size < max_model_len:
        raise DeriveError(f"max_model_len {max_model_len} exceeds the {num_blocks * engine.block_size} tokens the KV "
                          "cache holds (vLLM refuses to start); lower the max_model_len")

    pname = name or f"{model.name}-{gpu.name}" + (f"-tp{tp}" if tp > 1 else "")
    fitted_keys = ({k for k in ("prefill_mfu", "weight_bw_util", "roofline_sharpness")
                    if getattr(eff, k) == getattr(fitted.eff, k)} if fitted else set())
    eff_note = (f"roofline with prefill MFU {eff.prefill_mfu:g}, weight-read bandwidth utilization "
                f"{eff.weight_bw_util:g}, sharpness {eff.roofline_sharpness:g}, KV-read utilization "
                f"{eff.kv_bw_util:g}")
    eff_note += (f" ({', '.join(sorted(fitted_keys))} fitted to measured block timings; the rest stated "
                 "assumptions)" if fitted_keys else " (stated assumptions)")
    g = f"{gpu.name}: {gpu.peak(dtype) / 1e12:g} TFLOP/s dense {dtype}, {bw / 1e9:g} GB/s"
    return {
        "name": pname,
        "description": f"{model.name} {dtype} on {tp} x {gpu.description} under vLLM ({engine.scheduler} "
                       f"scheduler, chunked prefill {'on' if engine.chunked_prefill else 'off'}), derived from "
                       "first principles",
        "model": model.hf_id or model.name,
        "hardware": f"{tp} x {gpu.description}" if tp > 1 else gpu.description,
        "step": {"base_s": round(base_s, 7), "prefill_token_s": float(f"{prefill_token_s:.4g}"),
                 "decode_seq_s": float(f"{decode_seq_s:.4g}"), "context_token_s": float(f"{context_token_s:.4g}")},
        "kv": {"num_kv_blocks": num_blocks, "block_size": engine.block_size},
        "engine": {"max_num_seqs": engine.max_num_seqs, "max_num_batched_tokens": mnbt,
                   "max_model_len": max_model_len, "chunked_prefill": engine.chunked_prefill,
                   "scheduler": engine.scheduler},
        "mixing": {"grad1": float(f"{prefill_token_s:.4g}"), "grad2": float(f"{decode_seq_s:.4g}"),
                   "epsilon": 0.05, "alpha": 0.5, "min_step_s": round(base_s + decode_seq_s, 7)},
        "physics": {"model_config": model.name, "gpu": gpu.name, "dtype": dtype, "tp": tp,
                    "prefill_mfu": eff.prefill_mfu, "weight_bw_util": eff.weight_bw_util,
                    "kv_bw_util": eff.kv_bw_util, "step_overhead_s": eff.step_overhead_s,
                    "roofline_sharpness": eff.roofline_sharpness},
        "source": {
            "method": f"lbbench profile derive: {eff_note}; {g}",
            "base_s": f"step overhead {eff.step_overhead_s * 1e3:g} ms (scheduler, sampler, launches; assumption) + "
                      f"{read_bytes / 1e9:.2f} GB of weights streamed per step / ({eff.weight_bw_util:g} x "
                      f"{bw / 1e9:g} GB/s) = {mem_s * 1e3:.2f} ms",
            "prefill_token_s": f"{flops_tok / 1e9:.2f} GFLOP per prompt token (2 x block weights + attention at a "
                               f"{REFERENCE_PROMPT_TOKENS}-token prompt) / ({eff.prefill_mfu:g} x "
                               f"{peak / 1e12:g} TFLOP/s)",
            "decode_seq_s": f"least-squares slope over batch 1..{engine.max_num_seqs} of the decode roofline's "
                            f"excess over the weight read ({per_seq_compute_s * 1e6:.1f} us of compute per sequence "
                            f"at MFU {eff.prefill_mfu:g} against {mem_s * 1e3:.2f} ms of weight reads, "
                            + ("hard maximum)" if math.isinf(eff.roofline_sharpness)
                               else f"soft maximum of sharpness {eff.roofline_sharpness:g})"),
            "context_token_s": f"{kv_token_bytes / 1024:.0f} KiB of K and V per token per GPU / "
                               f"({eff.kv_bw_util:g} x {bw / 1e9:g} GB/s)",
            "num_kv_blocks": f"as vLLM's profiler: {gpu.memory_gib:g} GiB x {engine.gpu_memory_utilization:g} "
                             f"= {budget / GIB:.2f} GiB, less {weights_bytes / GIB:.2f} GiB of weights and "
                             f"{act_bytes / GIB:.2f} GiB activation peak ({mnbt} tokens, {engine.max_num_seqs} "
                             f"sampled sequences); CUDA context not charged; {kv_bytes / GIB:.2f} GiB / "
                             f"{kv_token_bytes * engine.block_size / 1024 ** 2:.3f} MiB per block",
            "block_size": "vLLM default (16 tokens)",
            "engine": f"max_num_seqs {engine.max_num_seqs}, max_model_len {max_model_len}, "
                      f"max_num_batched_tokens {mnbt}: as given to derive",
            "mixing": "grad1 and grad2 set to this profile's prefill and decode costs; alpha 0.5 as the paper; "
                      "epsilon 50 ms (not given in the paper)",
            "gpu": "; ".join(f"{k}: {v}" for k, v in gpu.sources.items()),
            **(_fit_sources(fitted, fitted_keys, gpu, dtype) if fitted_keys else {}),
        },
    }


def _fit_sources(fitted: FittedEfficiency, keys: set[str], gpu: GPU, dtype: str) -> dict:
    src, row = fitted.source, fitted.row
    out = {
        "efficiency": f"{', '.join(sorted(keys))} {row.describe()}; measured data: {fitted.citation()}; "
                      f"{src['method']}",
        "efficiency_assumptions": f"{src['not_measured']}; the factors were measured in fp16 and are applied to "
                                  f"{dtype}; {src['device_assumption']}",
    }
    if gpu.name != row.gpu:
        out["efficiency_transfer"] = (f"no factors are fitted on {gpu.name}: the {row.gpu} ones are applied to "
                                      f"{gpu.name}'s datasheet peak and bandwidth (assumption)" +
                                      (f"; held-out check of that transfer: {src['held_out']}"
                                       if src.get("held_out") else ""))
    return out
