"""Profiles from first principles: parameter counts, KV sizing as vLLM's profiler does it, roofline coefficients,
and the physical check of every shipped profile. Expected values are computed by hand in the comments."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.profiles import load_profile
from lbbench.profiles import profile_from_dict
from lbbench.profiling.calibration import load_calibration
from lbbench.profiling.derive import DeriveError, EngineLimits, derive_profile
from lbbench.profiling.gpus import UnknownGPUError, get_gpu
from lbbench.profiling.models import ModelConfigError, load_model_config, shipped_models
from lbbench.profiling.physics import implied_utilization, physical_problems
from lbbench.roofline import RooflineStepModel


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


#: a calibration with round factors and a hard roofline maximum, so that step times can be computed by hand
HAND_CALIBRATION = """
[calibration]
fitted_on = "nothing: round factors for a hand computation"
[efficiency]
weight_bw_util = 0.5
prefill_mfu = 0.5
sharpness = inf
kv_bw_util = 0.5
attn_mfu = 0.5
step_overhead_s = 0.001
layer_overhead_s = 0.0
[front_end]
api_overhead_s = 0.02
"""


@pytest.fixture
def hand_calibration(tmp_path):
    path = tmp_path / "hand.toml"
    path.write_text(HAND_CALIBRATION)
    return path


def test_a100_prefill_cost_is_physically_possible():
    prof = derive_profile(load_model_config("llama-3.1-8b"), get_gpu("a100-80gb"))
    # at least 2 x params / (0.8 x 312 TFLOP/s) = 2 x 8.03e9 / 2.496e14 = 64.3 us
    assert prof["step"]["prefill_token_s"] >= 2 * 8.030e9 / (0.8 * 312e12)


def test_kv_blocks_as_vllms_profiler():
    m, a100 = load_model_config("llama-3.1-8b"), get_gpu("a100-80gb")
    v0 = derive_profile(m, a100, engine=EngineLimits(max_num_seqs=128, chunked_prefill=False, scheduler="v0",
                                                     max_model_len=8192))
    # 79.15 GiB x 0.9 = 76,487,998,832 B; weights 8,030,261,248 x 2 = 16,060,522,496 B;
    # activations 8192 x 2 x (3 x 14336 + 3 x 4096 + 48 x 128) + 128 x 128256 x 8 = 1,137,967,104 B;
    # (76,487,998,832 - 16,060,522,496 - 1,137,967,104) / (131,072 x 16) = 28,271.4 blocks
    assert v0["kv"]["num_kv_blocks"] == 28271
    assert v0["engine"]["max_num_batched_tokens"] == 8192  # without chunked prefill: max(max_model_len, 2048)
    # vLLM V1's defaults on an A100: 256 sequences, 2048 batched tokens; activations 2048 x 2 x 61,440
    # + 256 x 128256 x 8 = 514,326,528 B; (76,487,998,832 - 16,060,522,496 - 514,326,528) / 2 MiB = 28,568.9
    v1 = derive_profile(m, a100)
    assert v1["kv"]["num_kv_blocks"] == 28568


def test_the_default_engine_is_vllm_v1_with_its_limits_on_the_gpu():
    m = load_model_config("llama-3.1-8b")
    for gpu, seqs, tokens in (("a100-80gb", 256, 2048), ("l4", 256, 2048), ("h100", 1024, 8192)):
        e = derive_profile(m, get_gpu(gpu))["engine"]
        assert (e["scheduler"], e["chunked_prefill"], e["max_num_seqs"], e["max_num_batched_tokens"],
                e["max_model_len"]) == ("v1", True, seqs, tokens, 8192), gpu
    v0 = derive_profile(m, get_gpu("h100"), engine=EngineLimits(scheduler="v0", chunked_prefill=False))
    assert (v0["engine"]["scheduler"], v0["engine"]["chunked_prefill"], v0["engine"]["max_num_seqs"]) == (
        "v0", False, 256)  # vLLM V0's max_num_seqs default


def test_step_times_by_hand_from_the_calibration(hand_calibration):
    cal = load_calibration(hand_calibration)
    doc = derive_profile(load_model_config("llama-3.1-8b"), get_gpu("a100-80gb"), calibration=cal)
    prof = profile_from_dict(doc, "derived")
    assert isinstance(prof.step_model, RooflineStepModel)
    assert doc["efficiency"] == cal.eff.as_dict() and prof.api_overhead_s == 0.02
    assert "hand.toml" in doc["source"]["efficiency"] and "round factors" in doc["source"]["efficiency"]
    # one decode sequence, a hard maximum: every weight byte read once at 0.5 x 2039 GB/s, the GEMMs' FLOPs far
    # below their read time. 32 layers x (83,886,080 + 352,321,536) B of projections and MLP + 1,050,673,152 B of
    # LM head + 5,505,024 B of fused elementwise traffic = 15,014,821,888 B / 1.0195e12 B/s = 14.727632 ms,
    # plus the 1 ms step overhead
    assert prof.step_model.decode_s(1) == pytest.approx(0.015727632, rel=1e-6)
    assert prof.min_step_s == pytest.approx(0.0157276, abs=1e-7)
    # KV read: 131,072 B per token / (0.5 x 2039 GB/s)
    assert prof.step_model.context_token_s == pytest.approx(1.2857e-7, rel=1e-4)
    # [step]'s linear coefficients summarize the roofline: the 1024-token prefill's cost per token, and a line
    # through decode_s over batch 1..max_num_seqs
    assert prof.prefill_token_s == pytest.approx(prof.step_model.prefill_s([(0, 1024)], 0) / 1024, rel=1e-3)
    assert prof.base_s + prof.decode_seq_s == pytest.approx(prof.step_model.decode_s(1), rel=0.05)
    assert (prof.grad1, prof.grad2) == (prof.prefill_token_s, prof.decode_seq_s)


def test_tensor_parallel_splits_weights_and_kv():
    m = load_model_config("llama-3.1-70b")
    with pytest.raises(DeriveError, match="does not fit"):
        derive_profile(m, get_gpu("a100-80gb"))
    tp4 = profile_from_dict(derive_profile(m, get_gpu("a100-80gb"), tp=4), "tp4")
    tp8 = profile_from_dict(derive_profile(m, get_gpu("a100-80gb"), tp=8), "tp8")
    # half the weights per GPU: a single-sequence step reads about half the bytes (all-reduce and fixed costs aside)
    assert 0.5 < tp8.step_model.decode_s(1) / tp4.step_model.decode_s(1) < 0.75
    # 8 KV heads over 8 GPUs: one head each, 1/8 of the KV bytes per token
    assert tp8.num_kv_blocks > 2 * tp4.num_kv_blocks
    with pytest.raises(DeriveError, match="do not split over TP 3"):
        derive_profile(m, get_gpu("a100-80gb"), tp=3)


def test_engine_limits_vllm_refuses_are_errors():
    m, a100 = load_model_config("llama-3.1-8b"), get_gpu("a100-80gb")
    with pytest.raises(DeriveError, match=r"max_num_batched_tokens \(4096\) must be >= max_model_len \(8192\)"):
        derive_profile(m, a100, engine=EngineLimits(chunked_prefill=False, max_num_batched_tokens=4096))
    with pytest.raises(DeriveError, match="engine scheduler 'v2'"):
        derive_profile(m, a100, engine=EngineLimits(scheduler="v2"))
    with pytest.raises(DeriveError, match=r"max_num_batched_tokens \(128\) must be >= max_num_seqs \(256\)"):
        derive_profile(m, a100, engine=EngineLimits(max_num_batched_tokens=128))


def test_impossible_profile_is_flagged():
    old = load_profile("llama3.1-8b-a100-v0").with_overrides(base_s=0.0164, prefill_token_s=4.78e-5)
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
        src = load_profile(r["name"]).source
        # a linear profile cites each coefficient; a roofline one its method and the calibration of its factors
        assert "num_kv_blocks" in src and ({"base_s", "prefill_token_s"} <= set(src) or
                                           {"method", "efficiency"} <= set(src)), r["name"]


def test_cli_derive_writes_a_loadable_profile(tmp_path):
    out = tmp_path / "x.toml"
    res = CliRunner().invoke(main, ["profile", "derive", "--model", "llama-3.1-8b", "--gpu", "a100-80gb",
                                    "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    p = load_profile(out)
    assert p.prefill_token_s >= 2 * 8.030e9 / (0.8 * 312e12)
    assert p.scheduler == "v1" and p.chunked_prefill and isinstance(p.step_model, RooflineStepModel)
    # the shipped calibration's factors, cited
    assert p.efficiency == load_calibration(None).eff.as_dict()
    assert "lbbench/profiling/data/calibration.toml" in json.loads(res.output)["source"]["efficiency"]
    # --scheduler v0 --no-chunked-prefill: the paper's engine, same physics
    res = CliRunner().invoke(main, ["profile", "derive", "--model", "llama-3.1-8b", "--gpu", "a100-80gb",
                                    "--scheduler", "v0", "--no-chunked-prefill", "--max-num-seqs", "128",
                                    "--out", str(tmp_path / "v0.toml")])
    assert res.exit_code == 0, res.output and "vLLM v0, chunked prefill off" in res.output
    v0 = load_profile(tmp_path / "v0.toml")
    assert (v0.scheduler, v0.chunked_prefill, v0.max_num_seqs, v0.num_kv_blocks) == ("v0", False, 128, 28271)
    assert v0.step_model.decode_s(7) == p.step_model.decode_s(7)


def test_cli_derive_takes_another_calibration_and_overrides(tmp_path, hand_calibration):
    res = CliRunner().invoke(main, ["profile", "derive", "--model", "llama-3.1-8b", "--gpu", "a100-80gb",
                                    "--calibration", str(hand_calibration), "--kv-bw-util", "0.25",
                                    "--note", "KV read halved to test", "--out", str(tmp_path / "x.toml")])
    assert res.exit_code == 0, res.output
    p = load_profile(tmp_path / "x.toml")
    assert p.efficiency["weight_bw_util"] == 0.5 and p.efficiency["kv_bw_util"] == 0.25
    assert p.step_model.decode_s(1) == pytest.approx(0.015727632, rel=1e-6)  # as computed by hand above
    assert p.step_model.context_token_s == pytest.approx(2 * 1.2857e-7, rel=1e-4)
    assert "kv_bw_util 0.25" in p.source["efficiency_overrides"] and p.source["note"] == "KV read halved to test"
    bad = tmp_path / "bad.toml"
    bad.write_text("[efficiency]\nprefill_mfu = 2.0\n")
    res = CliRunner().invoke(main, ["profile", "derive", "--model", "llama-3.1-8b", "--gpu", "a100-80gb",
                                    "--calibration", str(bad), "--out", str(tmp_path / "y.toml")])
    assert res.exit_code == 2 and "bad.toml" in res.output and "prefill_mfu" in res.output
    assert len(res.output.strip().splitlines()) == 1


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
