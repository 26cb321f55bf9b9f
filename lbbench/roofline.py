"""The physics step-time model: a vLLM engine step's GPU time from a roofline of every kernel group it runs.

A profile whose ``[step]`` table says ``model = "roofline"`` carries a ``[roofline]`` table of plain numbers
(what a model x GPU x tensor parallelism x dtype implies: bytes and FLOPs per layer, the GPU's peaks and links)
and the efficiency factors that turn them into seconds. ``lbbench profile derive`` writes it from a model config
and the GPU table (``lbbench.profiling.derive``); this module only evaluates it, so a profile stays a
self-contained, sourced file.

A step that runs ``T`` tokens through the model (``n`` decoding sequences, one token each, plus the prefill
chunks scheduled with them) costs

    t = step_overhead + L x layer_overhead                                   (launches, norms, sampler, scheduler)
      + sum over layers of  smax(bytes / (u_w x BW), 2 x params x T / (mfu x peak))   for each GEMM group
      + T x elementwise bytes per token / (u_w x BW)             (fused add-RMS-norms, SiLU-and-multiply, rotary)
      + LM head:            smax(bytes / (u_w x BW), 2 x params x S / (mfu x peak))   (S sequences sample)
      + decode attention:   context_tokens x KV bytes per token / (u_kv x BW)
      + prefill attention:  sum over chunks of 4 x L x heads x head_dim x c x (done + (c + 1) / 2) / (mfu_attn x peak)
                            + the chunk's earlier KV read, done x KV bytes per token / (u_kv x BW)
      + tensor parallelism: 2 x L x (a + 2 (TP - 1) / TP x T x hidden x 2 B / (u_link x link))

where ``smax(a, b) = (a^p + b^p)^(1/p)`` is the soft roofline of sharpness ``p`` (``lbbench.profiling.efficiency``
fits it to measured GEMM timings). The GEMM groups of a layer are its attention projections (QKV, output), and its
MLP: a dense gated MLP, or for a mixture-of-experts layer the router and shared expert (run by every token) plus
the routed experts, of which a batch of ``T`` tokens touches ``E (1 - (1 - k / E)^T)`` (each expert's weights are
read once per step, FLOPs follow the ``k`` experts each token runs). FP8 weights halve the bytes and use the FP8
tensor-core peak; the LM head stays in 16 bits, as quantized checkpoints keep it. All-reduce: two per layer
(after attention and after the MLP), ring all-reduce over the GPUs' peer links with a fixed latency per call.

The instance's skip-ahead needs a pure-decode step to be ``decode_s(n) + context_token_s x context_tokens``;
``decode_s`` is any function of ``n`` (memoized here), and the context term is linear, as the KV read is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Sequence

from .errors import InputError

#: what a ``[roofline]`` table must hold (the efficiency factors are in ``RooflineEfficiency``)
_SHAPE_KEYS = ("num_layers", "num_moe_layers", "tp", "hidden_size", "attn_bytes", "attn_params", "mlp_bytes",
               "mlp_params", "moe_fixed_bytes", "moe_fixed_params", "num_experts", "num_experts_per_tok",
               "expert_bytes", "expert_params", "lm_head_bytes", "lm_head_params", "kv_bytes_per_token",
               "attn_flops_per_token_pair", "elementwise_bytes_per_token", "peak_flops", "attn_peak_flops", "memory_bw_bytes_s", "link_bytes_s")


class RooflineError(InputError):
    """A ``[roofline]`` table that cannot be evaluated (the message names the key)."""


@dataclass(frozen=True)
class RooflineEfficiency:
    """The few factors that turn the roofline's bytes and FLOPs into seconds (what calibration fits)."""

    #: share of peak bandwidth reached streaming weights through GEMMs (small batches)
    weight_bw_util: float = 0.7
    #: share of peak FLOP/s reached by large GEMMs (16-bit)
    prefill_mfu: float = 0.65
    #: share of the FP8 peak reached by large FP8 GEMMs (W8A8 with per-tensor scales; measured lower than 16-bit)
    fp8_mfu: float = 0.55
    #: soft-roofline sharpness (how abruptly memory-bound hands over to compute-bound)
    sharpness: float = 1.34
    #: share of peak bandwidth reached reading the KV cache in decode attention
    kv_bw_util: float = 0.8
    #: share of peak FLOP/s reached by prefill attention
    attn_mfu: float = 0.4
    #: fixed cost of a step outside the layers' kernels (scheduler, sampler, input preparation), seconds
    step_overhead_s: float = 0.001
    #: fixed cost per layer per step (norms, rotary embedding, activation, quantization and launch latency), seconds
    layer_overhead_s: float = 1.0e-5
    #: latency of one tensor-parallel all-reduce, seconds
    allreduce_latency_s: float = 1.0e-5
    #: share of the peer link's bandwidth a ring all-reduce reaches
    allreduce_bw_util: float = 0.7

    def check(self, origin: str = "roofline") -> None:
        for name in ("weight_bw_util", "prefill_mfu", "fp8_mfu", "kv_bw_util", "attn_mfu", "allreduce_bw_util"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise RooflineError(f"{origin}: {name} {v} is outside (0, 1]")
        if not self.sharpness >= 1:
            raise RooflineError(f"{origin}: sharpness {self.sharpness} must be >= 1")
        for name in ("step_overhead_s", "layer_overhead_s", "allreduce_latency_s"):
            if getattr(self, name) < 0:
                raise RooflineError(f"{origin}: {name} must be >= 0")

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class RooflineShape:
    """The bytes and FLOPs one GPU (one tensor-parallel shard) handles per step, and its hardware."""

    num_layers: int
    num_moe_layers: int
    tp: int
    hidden_size: int
    attn_bytes: float  # QKV + output projection weights per layer, bytes
    attn_params: float
    mlp_bytes: float  # a dense layer's gated MLP
    mlp_params: float
    moe_fixed_bytes: float  # an MoE layer's router + shared expert
    moe_fixed_params: float
    num_experts: int
    num_experts_per_tok: int
    expert_bytes: float  # one routed expert
    expert_params: float
    lm_head_bytes: float
    lm_head_params: float
    kv_bytes_per_token: float  # K and V of one token on this GPU, all layers
    attn_flops_per_token_pair: float  # 4 x layers x query heads x head_dim / TP
    elementwise_bytes_per_token: float  # fused norms, activation, rotary embedding: bytes moved per token, all layers
    peak_flops: float  # the weights' GEMM dtype
    attn_peak_flops: float  # attention (and the LM head) run in 16 bits
    memory_bw_bytes_s: float
    link_bytes_s: float
    #: 1 when the block GEMMs run on FP8 tensor cores (FP8 weights and activations), else 0
    fp8_gemms: float = 0.0

    @classmethod
    def from_table(cls, table: dict[str, Any], origin: str = "roofline") -> "RooflineShape":
        kw = {"fp8_gemms": float(table.get("fp8_gemms", 0.0))}
        for key in _SHAPE_KEYS:
            if key not in table:
                raise RooflineError(f"{origin}: missing key roofline.{key}")
            v = table[key]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise RooflineError(f"{origin}: roofline.{key} must be a number >= 0, not {v!r}")
            kw[key] = v
        shape = cls(**kw)
        if shape.tp < 1 or shape.num_layers < 1 or shape.memory_bw_bytes_s <= 0 or shape.peak_flops <= 0:
            raise RooflineError(f"{origin}: roofline needs tp, num_layers, peak_flops and memory_bw_bytes_s > 0")
        if shape.tp > 1 and shape.link_bytes_s <= 0:
            raise RooflineError(f"{origin}: roofline.link_bytes_s must be > 0 with tp {shape.tp}")
        if shape.num_moe_layers and not 0 < shape.num_experts_per_tok <= shape.num_experts:
            raise RooflineError(f"{origin}: roofline.num_experts_per_tok must be in 1..num_experts")
        return shape

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class RooflineStepModel:
    """Step times of one engine from a :class:`RooflineShape` and :class:`RooflineEfficiency` (the
    ``StepModel`` the simulated instance asks: ``decode_s(n)``, ``context_token_s``, ``prefill_s(chunks, n)``)."""

    def __init__(self, shape: RooflineShape, eff: RooflineEfficiency):
        eff.check()
        self.shape, self.eff = shape, eff
        bw, peak = shape.memory_bw_bytes_s, shape.peak_flops
        self._mem = 1.0 / (eff.weight_bw_util * bw)  # seconds per weight byte
        gemm_mfu = eff.fp8_mfu if shape.fp8_gemms else eff.prefill_mfu
        self._flop = 1.0 / (gemm_mfu * peak)  # seconds per block-GEMM FLOP
        self._flop16 = 1.0 / (eff.prefill_mfu * shape.attn_peak_flops)  # the LM head's, in 16 bits
        self._p = eff.sharpness
        self.context_token_s = shape.kv_bytes_per_token / (eff.kv_bw_util * bw)
        self._attn_flop = shape.attn_flops_per_token_pair / (eff.attn_mfu * shape.attn_peak_flops)
        self._fixed_s = eff.step_overhead_s + shape.num_layers * eff.layer_overhead_s
        if shape.tp > 1:
            self._ar_fixed_s = 2 * shape.num_layers * eff.allreduce_latency_s
            self._ar_token_s = (2 * shape.num_layers * 2 * (shape.tp - 1) / shape.tp * shape.hidden_size * 2
                                / (eff.allreduce_bw_util * shape.link_bytes_s))
        else:
            self._ar_fixed_s = self._ar_token_s = 0.0
        self._elem_token_s = shape.elementwise_bytes_per_token * self._mem
        self._decode_memo: list[float] = []

    # ------------------------------------------------------------------ the roofline
    def _smax(self, a: float, b: float) -> float:
        p = self._p
        if math.isinf(p):
            return a if a > b else b
        top = a if a > b else b
        if top <= 0:
            return 0.0
        return top * ((a / top) ** p + (b / top) ** p) ** (1.0 / p)

    def gemm_s(self, num_tokens: float, num_sampled: float) -> float:
        """Every GEMM of a step of ``num_tokens`` tokens, ``num_sampled`` of which produce logits."""
        s = self.shape
        mem, flop, t = self._mem, self._flop, num_tokens
        dense = s.num_layers - s.num_moe_layers
        out = s.num_layers * self._smax(s.attn_bytes * mem, 2.0 * s.attn_params * t * flop)
        if dense:
            out += dense * self._smax(s.mlp_bytes * mem, 2.0 * s.mlp_params * t * flop)
        if s.num_moe_layers:
            e, k = s.num_experts, s.num_experts_per_tok
            touched = e * (1.0 - (1.0 - k / e) ** t) if t > 0 else 0.0
            moe_bytes = s.moe_fixed_bytes + touched * s.expert_bytes
            moe_flops = 2.0 * (s.moe_fixed_params + k * s.expert_params) * t
            out += s.num_moe_layers * self._smax(moe_bytes * mem, moe_flops * flop)
        if num_sampled > 0:
            out += self._smax(s.lm_head_bytes * mem, 2.0 * s.lm_head_params * num_sampled * self._flop16)
        return out

    def step_s(self, num_tokens: float, num_sampled: float) -> float:
        """A step's time apart from attention: fixed costs, GEMMs, all-reduce."""
        return (self._fixed_s + self.gemm_s(num_tokens, num_sampled)
                + (self._ar_token_s + self._elem_token_s) * num_tokens + self._ar_fixed_s)

    # ------------------------------------------------------------------ the StepModel protocol
    def decode_s(self, num_decode: int) -> float:
        """A step with ``num_decode`` decoding sequences and nothing to prefill, the KV read aside."""
        memo = self._decode_memo
        if num_decode < len(memo):
            return memo[num_decode]
        for n in range(len(memo), num_decode + 1):
            memo.append(self.step_s(n, n) if n else self._fixed_s)
        return memo[num_decode]

    def prefill_s(self, chunks: Sequence[tuple[int, int]], num_decode: int) -> float:
        """What the prefill ``chunks`` (tokens computed before, chunk tokens) add to a step with ``num_decode``
        decoding sequences: the larger GEMMs and all-reduce, and the chunks' attention."""
        if not chunks:
            return 0.0
        new = sum(c for _, c in chunks)
        t = num_decode + new
        extra = self.step_s(t, num_decode + len(chunks)) - self.decode_s(num_decode)
        pairs = 0.0
        done_tokens = 0
        for done, c in chunks:
            pairs += c * (done + (c + 1) * 0.5)
            done_tokens += done
        return extra + pairs * self._attn_flop + done_tokens * self.context_token_s

    def step_time_s(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        """A step of one fresh prompt chunk of ``prefill_tokens`` and ``decode_seqs`` decodes over
        ``context_tokens`` of KV (the linear model's signature, for speed figures)."""
        chunks = [(0, prefill_tokens)] if prefill_tokens else []
        return self.decode_s(decode_seqs) + self.context_token_s * context_tokens + self.prefill_s(chunks, decode_seqs)
