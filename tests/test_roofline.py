"""The physics step-time model: each term against a value computed by hand (comments show the arithmetic)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.profiling.gpus import get_gpu
from lbbench.profiling.models import load_model_config
from lbbench.profiling.roofline_derive import roofline_shape
from lbbench.roofline import RooflineEfficiency, RooflineError, RooflineShape, RooflineStepModel

#: a hard maximum and round numbers so that each term can be checked on paper
HARD = RooflineEfficiency(weight_bw_util=0.5, prefill_mfu=0.5, sharpness=math.inf, kv_bw_util=0.5, attn_mfu=0.25,
                          step_overhead_s=0.001, layer_overhead_s=0.0, allreduce_latency_s=1e-5,
                          allreduce_bw_util=0.5)


def _no_elementwise(shape: RooflineShape) -> RooflineShape:
    return RooflineShape(**{**shape.as_dict(), "elementwise_bytes_per_token": 0.0})


def test_dense_shape_llama31_8b_h100():
    s = roofline_shape(load_model_config("llama-3.1-8b"), get_gpu("h100"))
    # attention projections: 4096 x (32 + 2 x 8) x 128 + 32 x 128 x 4096 = 41,943,040 params, 2 bytes each
    assert s.attn_params == 41_943_040 and s.attn_bytes == 83_886_080
    # gated MLP: 3 x 4096 x 14336 = 176,160,768 params
    assert s.mlp_params == 176_160_768
    # KV: 2 x 32 layers x 8 heads x 128 x 2 bytes = 131,072 bytes per token
    assert s.kv_bytes_per_token == 131_072
    # elementwise per token, all layers: 32 x (32,768 + 43,008 + 10,240) x 2 B = 5,505,024 B
    assert s.elementwise_bytes_per_token == 5_505_024
    assert s.peak_flops == 989e12 and s.link_bytes_s == 450e9


def test_decode_step_by_hand_dense():
    s = _no_elementwise(roofline_shape(load_model_config("llama-3.1-8b"), get_gpu("h100")))
    m = RooflineStepModel(s, HARD)
    # batch 1, memory-bound everywhere: 1 ms overhead + weight bytes / (0.5 x 3.35 TB/s)
    # weights per step: 32 x (83,886,080 + 352,321,536) + 128256 x 4096 x 2 (LM head) = 14,009,367,552 B
    weights = 32 * (83_886_080 + 352_321_536) + 128256 * 4096 * 2
    assert m.decode_s(1) == pytest.approx(0.001 + weights / (0.5 * 3350e9), rel=1e-12)
    # the KV read: 131,072 B per token / (0.5 x 3.35 TB/s) = 78.25 ns per context token
    assert m.context_token_s == pytest.approx(131_072 / (0.5 * 3350e9), rel=1e-12)
    assert m.decode_s(0) == pytest.approx(0.001)


def test_compute_bound_prefill_by_hand():
    s = _no_elementwise(roofline_shape(load_model_config("llama-3.1-8b"), get_gpu("h100")))
    m = RooflineStepModel(s, HARD)
    # 8192 new tokens: every GEMM compute-bound (2 x params x 8192 / (0.5 x 989 TFLOP/s)); the LM head runs for
    # the one sampled sequence and stays memory-bound; attention: 4 x 32 x 32 x 128 x 8192 x (0 + 8193 / 2)
    # FLOPs / (0.25 x 989 TFLOP/s)
    gemm = 2 * 32 * (41_943_040 + 176_160_768) * 8192 / (0.5 * 989e12)
    lm = 128256 * 4096 * 2 / (0.5 * 3350e9)
    attn = 4 * 32 * 32 * 128 * 8192 * (8193 / 2) / (0.25 * 989e12)
    expect = 0.001 + gemm + lm + attn
    got = m.decode_s(0) + m.prefill_s([(0, 8192)], 0)
    assert got == pytest.approx(expect, rel=1e-12)


def test_prefill_of_a_cached_prefix_reads_its_kv():
    s = _no_elementwise(roofline_shape(load_model_config("llama-3.1-8b"), get_gpu("h100")))
    m = RooflineStepModel(s, HARD)
    # a 16-token chunk after 1,024 cached tokens adds, beyond a fresh 16-token chunk, the attention over the
    # 1,024 earlier tokens (4 x 32 x 32 x 128 x 16 x 1024 FLOPs) and their KV read (1,024 x 131,072 B)
    extra = m.prefill_s([(1024, 16)], 0) - m.prefill_s([(0, 16)], 0)
    expect = 4 * 32 * 32 * 128 * 16 * 1024 / (0.25 * 989e12) + 1024 * 131_072 / (0.5 * 3350e9)
    assert extra == pytest.approx(expect, rel=1e-9)


def test_tensor_parallel_all_reduce_by_hand():
    model, gpu = load_model_config("llama-2-70b"), get_gpu("h100")
    one = _no_elementwise(roofline_shape(model, gpu, tp=4))
    # per GPU: Q and O split 4 ways, 8 KV heads -> 2 per GPU: 8192 x 64 x 128 / 4 x 2 + 2 x 8192 x 2 x 128
    assert one.attn_params == 8192 * 64 * 128 / 4 * 2 + 2 * 8192 * 2 * 128
    m = RooflineStepModel(one, HARD)
    no_ar = RooflineStepModel(one, RooflineEfficiency(**{**HARD.as_dict(), "allreduce_latency_s": 0.0,
                                                          "allreduce_bw_util": 1.0}))
    # decode of 64 sequences: 2 x 80 all-reduces of 64 x 8192 x 2 B; ring: 2 x 3/4 of that over 0.5 x 450 GB/s
    ar = 2 * 80 * (1e-5 + 2 * 3 / 4 * 64 * 8192 * 2 / (0.5 * 450e9))
    ar_free = 2 * 80 * (2 * 3 / 4 * 64 * 8192 * 2 / (1.0 * 450e9))
    assert m.decode_s(64) - no_ar.decode_s(64) == pytest.approx(ar - ar_free, rel=1e-9)


def test_kv_heads_are_replicated_beyond_their_count():
    model = load_model_config("llama-3.1-70b")  # 8 KV heads
    # TP 16 keeps one KV head per GPU: 2 x 80 x 1 x 128 x 2 B per token
    assert roofline_shape(model, get_gpu("h100"), tp=16).kv_bytes_per_token == 2 * 80 * 1 * 128 * 2


def test_moe_touched_experts_and_active_flops_by_hand():
    model = load_model_config("mixtral-8x7b")
    s = _no_elementwise(roofline_shape(model, get_gpu("h100"), tp=2))
    # one expert on one of 2 GPUs: 3 x 4096 x 14336 / 2 = 88,080,384 params
    assert s.expert_params == 88_080_384 and s.num_experts == 8 and s.num_experts_per_tok == 2
    m = RooflineStepModel(s, HARD)
    # one token touches 2 experts; 3 tokens touch 8 x (1 - (6/8)^3) = 4.625 in expectation
    assert model.experts_touched(1) == pytest.approx(2.0)
    assert model.experts_touched(3) == pytest.approx(4.625)
    # decode of 3 sequences, memory-bound: the MoE part of a layer reads router + 4.625 experts
    dense_part = 32 * s.attn_bytes + s.lm_head_bytes
    moe_part = 32 * (s.moe_fixed_bytes + 4.625 * s.expert_bytes)
    ar = 2 * 32 * (1e-5 + 2 * 1 / 2 * 3 * 4096 * 2 / (0.5 * 450e9))
    assert m.decode_s(3) == pytest.approx(0.001 + (dense_part + moe_part) / (0.5 * 3350e9) + ar, rel=1e-12)


def test_fp8_halves_weight_bytes_and_uses_the_fp8_peak():
    model = load_model_config("llama-3.1-8b")
    bf16 = roofline_shape(model, get_gpu("h100"))
    fp8 = roofline_shape(model, get_gpu("h100"), weights_dtype="fp8", kv_dtype="fp8")
    assert fp8.mlp_bytes == bf16.mlp_bytes / 2 and fp8.attn_bytes == bf16.attn_bytes / 2
    assert fp8.lm_head_bytes == bf16.lm_head_bytes  # the LM head stays in 16 bits
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token / 2
    assert fp8.peak_flops == 1979e12 and fp8.attn_peak_flops == 989e12
    # an A100 has no FP8 tensor cores: FP8 weights run weight-only, on the 16-bit peak
    a100 = roofline_shape(model, get_gpu("a100-80gb"), weights_dtype="fp8")
    assert a100.peak_flops == 312e12 and a100.mlp_bytes == bf16.mlp_bytes / 2


def test_llama4_scout_counts_its_shared_expert():
    model = load_model_config("llama-4-scout-17b-16e-fp8")
    assert model.weights_dtype == "fp8" and model.num_experts == 16 and model.num_experts_per_tok == 1
    # the published 17B active / 109B total (text part: 16.1 B active incl. LM head, 107.8 B)
    assert round((model.active_block_params + model.vocab_size * model.hidden_size) / 1e9, 1) == 16.1
    assert round(model.num_params / 1e9, 1) == 107.8


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 512), chunk=st.integers(1, 4096), done=st.integers(0, 8192))
def test_step_time_grows_with_work(n, chunk, done):
    s = roofline_shape(load_model_config("mixtral-8x7b"), get_gpu("h100"), tp=2)
    m = RooflineStepModel(s, RooflineEfficiency())
    assert m.decode_s(n + 1) >= m.decode_s(n) > 0
    assert m.prefill_s([(done, chunk)], n) > 0
    assert m.prefill_s([(done, chunk + 1)], n) >= m.prefill_s([(done, chunk)], n)


def test_bad_table_names_the_key():
    good = roofline_shape(load_model_config("llama-3.1-8b"), get_gpu("h100")).as_dict()
    bad = dict(good)
    del bad["kv_bytes_per_token"]
    with pytest.raises(RooflineError, match="roofline.kv_bytes_per_token"):
        RooflineShape.from_table(bad, "p.toml")
    with pytest.raises(RooflineError, match="weight_bw_util"):
        RooflineEfficiency(weight_bw_util=1.5).check()


def test_fp8_gemms_use_their_own_efficiency_and_the_lm_head_stays_16_bit():
    model = load_model_config("llama-3.1-8b")
    s = _no_elementwise(roofline_shape(model, get_gpu("h100"), weights_dtype="fp8"))
    assert s.fp8_gemms == 1.0
    eff = RooflineEfficiency(**{**HARD.as_dict(), "fp8_mfu": 0.4})
    m = RooflineStepModel(s, eff)
    # 8192 tokens, compute-bound: block GEMMs at 0.4 x 1,979 TFLOP/s; the LM head (one sampled sequence,
    # memory-bound) reads 16-bit weights; attention at 0.25 x 989 TFLOP/s
    gemm = 2 * 32 * (41_943_040 + 176_160_768) * 8192 / (0.4 * 1979e12)
    lm = 128256 * 4096 * 2 / (0.5 * 3350e9)
    attn = 4 * 32 * 32 * 128 * 8192 * (8193 / 2) / (0.25 * 989e12)
    assert m.decode_s(0) + m.prefill_s([(0, 8192)], 0) == pytest.approx(0.001 + gemm + lm + attn, rel=1e-12)
