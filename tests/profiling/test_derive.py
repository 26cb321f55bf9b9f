"""Profiles from first principles: parameter counts, KV sizing as vLLM's profiler does it, roofline coefficients,
and the physical check of every shipped profile. Expected values are computed by hand in the comments."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.profiles import load_profile
from lbbench.profiling.derive import DeriveError, Efficiency, EngineSettings, derive_profile
from lbbench.profiling.gpus import UnknownGPUError, get_gpu
from lbbench.profiling.models import ModelConfigError, load_model_config, shipped_models
from lbbench.profiling.physics import implied_utilization, physical_problems


def test_parameter_counts_match_the_published_ones():
    assert load_model_config("llama-2-7b").num_params == 6_738_415_616
    assert load_model_config("llama-3.1-8b").num_params == 8_030_261_248
    assert round(load_model_config("llama-3.1-70b").num_params / 1e9, 1) == 70.6
    assert round(load_model_config("mistral-7b").num_params / 1e9, 2) == 7.24
    assert round(load_model_config("qwen2.5-7b").num_params / 1e9, 2) == 7.62
    assert set(shipped_models()) >= {"llama-2-7b", "llama-3.1-8b", "llama-3.1-70b", "mistral-7b", "qwen2.5-7b"}


def test_kv_bytes_per_token():
    # 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes
    assert load_model_config("llama-3.1-8b").kv_bytes_per_token("bf16") == 131_072
    # 2 x 32 x 32 x 128 x 2
    assert load_model_config("llama-2-7b").kv_bytes_per_token("fp16") == 524_288


def test_a100_prefill_cost_is_physically_possible():
    prof = derive_profile(load_model_config("llama-3.1-8b"), get_gpu("a100-80gb"))
    # at least 2 x params / (0.8 x 312 TFLOP/s) = 2 x 8.03e9 / 2.496e14 = 64.3 us
    assert prof["step"]["prefill_token_s"] >= 2 * 8.030e9 / (0.8 * 312e12)


def test_kv_blocks_as_vllms_profiler():
    prof = derive_profile(load_model_config("llama-3.1-8b"), get_gpu("a100-80gb"), dtype="bf16",
                          engine=EngineSettings(max_num_seqs=128, chunked_prefill=False, max_model_len=8192))
    # 79.15 GiB x 0.9 = 76,487,998,832 B; weights 8,030,261,248 x 2 = 16,060,522,496 B;
    # activations 8192 x 2 x (3 x 14336 + 3 x 4096 + 48 x 128) + 128 x 128256 x 8 = 1,137,967,104 B;
    # (76,487,998,832 - 16,060,522,496 - 1,137,967,104) / (131,072 x 16) = 28,271.4 blocks
    assert prof["kv"]["num_kv_blocks"] == 28271
    assert prof["engine"]["max_num_batched_tokens"] == 8192


def test_roofline_coefficients_by_hand():
    # stated factors (Efficiency's defaults: MFU 0.5, weight-read 0.8, a hard max), not the fitted ones
    prof = derive_profile(load_model_config("llama-2-7b"), get_gpu("v100-16gb"), dtype="fp16", eff=Efficiency(),
                          engine=EngineSettings(max_num_seqs=128, chunked_prefill=False, max_model_len=2048))
    s = prof["step"]
    # prefill: 2 x 32 x 202,383,360 block weights + 4 x 32 x 4096 x 512 = 13.221 GFLOP / (0.5 x 125 TFLOP/s)
    assert s["prefill_token_s"] == pytest.approx(2.1154e-4, rel=1e-3)
    # base: 1.5 ms + (6,476,267,520 + 4096 + 131,072,000) x 2 B / (0.8 x 900 GB/s) = 1.5 + 18.354 ms
    assert s["base_s"] == pytest.approx(0.0198537, rel=1e-5)
    # KV read: 512 KiB per token / (0.5 x 900 GB/s) = 1.165 us
    assert s["context_token_s"] == pytest.approx(1.165e-6, rel=1e-3)
    # (15.78 GiB x 0.9 - 13,476,831,232 B - 268,697,600 B activations) / 8 MiB per block = 179.3
    assert prof["kv"]["num_kv_blocks"] == 179


def test_tensor_parallel_splits_weights_and_kv():
    m = load_model_config("llama-3.1-70b")
    with pytest.raises(DeriveError, match="does not fit"):
        derive_profile(m, get_gpu("a100-80gb"))
    tp4 = derive_profile(m, get_gpu("a100-80gb"), tp=4, eff=Efficiency())
    tp8 = derive_profile(m, get_gpu("a100-80gb"), tp=8, eff=Efficiency())
    assert tp8["step"]["prefill_token_s"] == pytest.approx(tp4["step"]["prefill_token_s"] / 2, rel=1e-3)
    # with the fitted factors, TP 8's smaller GEMMs reach a lower MFU (0.643 against 0.722 at TP 4 on A100)
    fit4, fit8 = (derive_profile(m, get_gpu("a100-80gb"), tp=tp)["physics"]["prefill_mfu"] for tp in (4, 8))
    assert fit8 < fit4
    # 8 KV heads over 8 GPUs: one head each, 1/8 of the KV bytes per token
    assert tp8["kv"]["num_kv_blocks"] > 2 * tp4["kv"]["num_kv_blocks"]


def test_impossible_profile_is_flagged():
    old = load_profile("llama3.1-8b-a100").with_overrides(base_s=0.0164, prefill_token_s=4.78e-5)
    assert implied_utilization(old)["prefill_mfu"] > 0.9  # the previous, impossible A100 profile
    assert any("MFU" in p for p in physical_problems(old))


def test_shipped_profiles_are_physically_possible():
    out = CliRunner().invoke(main, ["profiles", "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    names = {r["name"] for r in rows}
    assert {"llama2-7b-v100", "llama3.1-8b-a100", "llama3.1-8b-a100-40gb"} <= names
    for r in rows:
        if r["name"] in ("llama2-7b-v100", "llama3.1-8b-a100", "llama3.1-8b-a100-40gb"):
            assert r["prefill_mfu"] is not None and r["decode_bw_util"] is not None
        if r["prefill_mfu"] is not None:
            assert 0 < r["prefill_mfu"] <= 0.8, r
            assert 0 < r["decode_bw_util"] <= 0.9, r
        assert set(load_profile(r["name"]).source) >= {"base_s", "prefill_token_s", "num_kv_blocks"}


def test_cli_derive_writes_a_loadable_profile(tmp_path):
    out = tmp_path / "x.toml"
    res = CliRunner().invoke(main, ["profile", "derive", "--model", "llama-3.1-8b", "--gpu", "a100-80gb",
                                    "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    p = load_profile(out)
    assert p.prefill_token_s >= 2 * 8.030e9 / (0.8 * 312e12)
    assert p.scheduler == "v1" and p.chunked_prefill
    # the A100 TP 1 fit: prefill MFU 0.674; batch-1 step 1.5 ms + 15.0 GB / (0.694 x 2039 GB/s) + decode_seq_s
    # = 12.16 ms, so 15.0 GB / (12.16 ms x 2039 GB/s) = 0.61 of peak bandwidth (overhead and LM head included)
    assert implied_utilization(p) == {"prefill_mfu": 0.674, "decode_bw_util": pytest.approx(0.61, abs=0.01)}


@pytest.mark.parametrize("args, message", [
    (["--model", "nope", "--gpu", "a100-80gb"], "not a shipped config"),
    (["--model", "llama-3.1-8b", "--gpu", "tpu-v9"], "unknown GPU 'tpu-v9'"),
    (["--model", "llama-2-7b", "--gpu", "v100", "--dtype", "bf16"], "no bf16"),
    (["--model", "llama-3.1-8b", "--gpu", "l4", "--max-model-len", "200000"], "--max-model-len 200000 exceeds"),
])
def test_cli_derive_bad_input_one_line_exit_2(tmp_path, args, message):
    res = CliRunner().invoke(main, ["profile", "derive", *args, "--out", str(tmp_path / "x.toml")])
    assert res.exit_code == 2
    assert message in res.output and len(res.output.strip().splitlines()) == 1


def test_model_config_missing_field_names_it(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "vocab_size": 100}))
    with pytest.raises(ModelConfigError, match="missing field 'intermediate_size'"):
        load_model_config(tmp_path)
    with pytest.raises(UnknownGPUError):
        get_gpu("nope")
