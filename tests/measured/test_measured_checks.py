"""Physical-bound flags, against bounds worked out by hand from the shipped model configs and the GPU table."""

from __future__ import annotations

import json

import pytest

from lbbench.measured.checks import bounds, check_rows
from lbbench.measured.model_facts import ModelFacts
from lbbench.measured.schema import MeasuredRowError, build_row


def _row(**cells):
    base = {"id": "exp", "stage": 0, "model": "meta-llama/Llama-2-7b-hf", "gpu": "h100", "tp": 1,
            "arrival": "constant", "rate_rps": 5.0, "output_tokens": 247, "weights_dtype": "fp16",
            "throughput_rps": 5.0}
    return build_row({**base, **cells}, error=lambda p, column=None: MeasuredRowError("t", p, column=column))


# Llama-2-7B (lbbench/profiling/models/llama-2-7b.json): 32 layers of 4 x 4096^2 attention + 3 x 4096 x 11008 MLP
# + 2 x 4096 norms = 202,383,360 weights; with the final norm and the 32,000 x 4096 output projection a decode step
# reads 6,607,343,616 fp16 weights = 13.215 GB; at 3,350 GB/s (H100 SXM) that is 3.9447 ms.
STEP_MS = 6_607_343_616 * 2 / 3350e9 * 1e3


def test_decode_bound_is_one_read_of_the_weights():
    b, why = bounds(_row(), ModelFacts())
    assert why == "" and b.step_s * 1e3 == pytest.approx(STEP_MS, rel=1e-9)
    b2, _ = bounds(_row(tp=2), ModelFacts())
    assert b2.step_s == pytest.approx(b.step_s / 2)


def test_the_training_summaries_3_6_ms_is_flagged():
    """issue 36: Llama-2-7B FP16 on an H100 with a mean TPOT of 3.6 ms, below the ~4 ms weight read."""
    row = _row(itl_mean_ms=3.6, tpot_p50_ms=3.58, tpot_p99_ms=4.34, ttft_mean_ms=25.04, e2e_mean_ms=1810.32,
               ignore_eos=True)
    rep = check_rows([row], path="dev.csv")
    assert [f.line() for f in rep.flags] == [
        f"dev.csv: row 1 (id=exp, stage=0): {col} {v} is below 3.94 ms, one read of the 13.2 GB of fp16 weights per "
        "decode step / (1 x 3350 GB/s, h100)" for col, v in (("itl_mean_ms", 3.6), ("tpot_p50_ms", 3.58))]
    assert not rep.not_checked
    # the same stage as imported (7.25 ms a token) passes
    assert check_rows([_row(itl_mean_ms=7.249, tpot_p50_ms=7.196, ttft_mean_ms=25.04, e2e_mean_ms=1810.32,
                            ignore_eos=True)]).flags == []


def test_prefill_and_e2e_bounds():
    # 466 uncached question tokens x 2 x 6,476,267,520 block weights = 6.04 TFLOP at 989 TFLOP/s = 6.10 ms
    prefill_ms = 466 * 2 * 32 * 202_383_360 / 989e12 * 1e3
    row = _row(question_tokens=466, system_prompt_tokens=100, ttft_mean_ms=5.0, ttft_p50_ms=6.2,
               e2e_mean_ms=900.0, ignore_eos=True)
    lines = [f.line() for f in check_rows([row]).flags]
    assert lines[0] == (f"row 1 (id=exp, stage=0): ttft_mean_ms 5.0 is below {prefill_ms:.3g} ms, one prefill: 466 "
                        "question tokens (the shared system prompt may be cached) x 13.0 GFLOP at the fp16 peak of 1 "
                        f"x 989 TFLOP/s, and no less than one read of the weights ({STEP_MS:.2f} ms)")
    e2e_ms = prefill_ms + 246 * STEP_MS
    assert lines[1] == (f"row 1 (id=exp, stage=0): e2e_mean_ms 900.0 is below {e2e_ms:.0f} ms: the prefill bound plus "
                        f"246 decode steps of at least {STEP_MS:.3g} ms (ignore_eos: every request generates 247 "
                        "tokens)")
    assert len(lines) == 2  # ttft_p50 6.2 ms is above the 6.10 ms bound


def test_rate_and_token_flags_need_no_model():
    row = _row(model="org/unknown-model", requests=3000, throughput_rps=5.5, output_tok_s=966.0, ignore_eos=True)
    rep = check_rows([row])
    assert [f.line() for f in rep.flags] == [
        "row 1 (id=exp, stage=0): throughput_rps 5.5 is above the offered rate_rps 5.0 by 10.0 %, more than a stage's "
        "noise (5.5 %): a stage cannot complete more than it was sent",
        "row 1 (id=exp, stage=0): output_tok_s 966.0 is 28.9 % below throughput_rps x output_tokens = 1358.5, what "
        "ignore_eos makes the completed requests generate: the tokens were counted from the returned text, not "
        "generated"]
    assert [f.line() for f in rep.not_checked] == [
        "row 1 (id=exp, stage=0): decode, prefill and E2E bounds not checked: no config.json for org/unknown-model "
        "(give --model-configs DIR)"]
    over = check_rows([_row(throughput_rps=5.0, output_tok_s=1300.0)]).flags
    assert [f.column for f in over] == ["output_tok_s"] and "more tokens than the completed requests" in over[0].text


def test_what_cannot_be_checked_says_why(tmp_path):
    (tmp_path / "mixtral-8x7b-v0.1.json").write_text(json.dumps({
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 32000, "torch_dtype": "bfloat16", "num_local_experts": 8,
        "num_experts_per_tok": 2}))
    facts = ModelFacts((tmp_path,))
    moe = _row(model="mistralai/Mixtral-8x7B-v0.1", weights_dtype=None, itl_mean_ms=1.0)
    b, why = bounds(moe, facts)
    cfg, _ = facts.config(moe.model)
    if getattr(cfg, "is_moe", False):  # lbbench.profiling.models reads experts: the bound is one token's experts
        assert b is not None and "active weights (one token's experts)" in b.step_why
    else:
        assert b is None and why == ("mistralai/Mixtral-8x7B-v0.1 is a mixture of experts, which "
                                     "lbbench.profiling.models does not read yet")
    assert bounds(_row(gpu="tpu-v9"), facts)[1].startswith("unknown GPU 'tpu-v9'")
    assert facts.weights_dtype(moe.model) == "bf16"
