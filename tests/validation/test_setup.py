"""From measured rows to simulated setups: the workload's structure, the profile's engine limits, the reasons a
row is not covered."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_prefix_row  # noqa: F401 (tests/validation/conftest.py)
from lbbench.roofline import RooflineEfficiency
from lbbench.validation.setup import MLPERF_CNNDM_PROMPTS, build_setup, mlperf_prompts_for
from lbbench.workloads.shared_prefix import SharedPrefixSpec, Stage, shared_prefix_requests

EFF = RooflineEfficiency()


def test_shared_prefix_prompts_repeat_and_share_their_group_blocks():
    spec = SharedPrefixSpec(num_groups=2, prompts_per_group=3, system_prompt_tokens=40, question_tokens=50,
                            output_tokens=8, multi_turn=True)
    reqs, stage = shared_prefix_requests(spec, [Stage(3.0, 4.0)], seed=1)
    assert len(reqs) == 12 and set(stage) == {0}
    # constant arrivals: one every 1/3 s
    assert [r.arrival_s for r in reqs[:3]] == pytest.approx([0.0, 1 / 3, 2 / 3])
    # 90 tokens -> 5 full 16-token blocks named; the first 2 (32 tokens) lie inside the 40-token system prompt
    assert all(r.prompt_tokens == 90 and len(r.prefix_hashes) == 5 for r in reqs)
    # request i uses prompt i mod 6: the same prompt (all hashes) every 6 requests
    assert reqs[0].prefix_hashes == reqs[6].prefix_hashes and reqs[0].prefix_hashes != reqs[1].prefix_hashes
    # prompts of one group share their system-prompt blocks and nothing after them
    firsts = {r.prefix_hashes[:2] for r in reqs[:6]}
    assert len(firsts) == 2
    for a in reqs[:6]:
        for b in reqs[:6]:
            if a is not b and a.prefix_hashes[:2] == b.prefix_hashes[:2] and a.prefix_hashes != b.prefix_hashes:
                assert a.prefix_hashes[2:] != b.prefix_hashes[2:]
    # no per-user lock by default (open loop), a closed-loop session with user_lock
    assert reqs[0].session_id is None
    locked, _ = shared_prefix_requests(SharedPrefixSpec(2, 3, 40, 50, 8, multi_turn=True, user_lock=True),
                                       [Stage(3.0, 4.0)])
    assert (locked[7].session_id, locked[7].turn) == (1, 1)


def test_setup_of_a_shared_prefix_experiment():
    rows = [shared_prefix_row(), shared_prefix_row(stage="1", rate_rps="4", requests="80", prompt_tokens_mean="277.2")]
    s = build_setup("exp-a", rows, EFF)
    assert s.not_covered is None
    p = s.profile
    assert (p.max_num_seqs, p.max_num_batched_tokens, p.max_model_len, p.enable_prefix_caching) == (64, 2048, 4096,
                                                                                                    True)
    assert p.roofline and p.scheduler == "v1" and p.chunked_prefill
    # 20 s at 2 req/s, then 20 s at 4 req/s
    assert list(np.bincount(s.stage_of)) == [40, 80] and s.stage_spans_s == [(0.0, 20.0), (20.0, 40.0)]


def test_measured_prompt_mean_scales_the_prompts():
    s = build_setup("exp-a", [shared_prefix_row(prompt_tokens_mean="277.2")], EFF)
    # 277.2 / 264 = 1.05: system 64 -> 67, question 200 -> 210
    assert s.requests[0].prompt_tokens == 277
    assert any("scaled by 1.050" in n for n in s.notes)


@pytest.mark.parametrize("change, reason", [
    ({"model": "acme/unknown-13b"}, "no shipped config"),
    ({"gpu": "tpu-v9"}, "unknown GPU"),
    ({"arrival": "burst"}, "burst arrivals"),
    ({"prefix_groups": "", "prompt_tokens_mean": ""}, "prompt lengths unknown"),
    ({"model": "meta-llama/Llama-2-70b-hf", "tp": "1"}, "does not fit"),
])
def test_rows_that_cannot_be_built_say_why(change, reason):
    s = build_setup("exp-a", [shared_prefix_row(**change)], EFF)
    assert s.not_covered is not None and reason in s.not_covered


def test_mlperf_rows_take_the_cnn_dailymail_assumption():
    row = shared_prefix_row(source="MLPerf Inference v5.1 closed, Red Hat", prefix_groups="", arrival="poisson",
                            rate_rps="5", duration_s="40", requests="200", output_tokens="128")
    assert mlperf_prompts_for(row) is MLPERF_CNNDM_PROMPTS
    s = build_setup("mlperf", [row], EFF, prompts=MLPERF_CNNDM_PROMPTS)
    lengths = np.array([r.prompt_tokens for r in s.requests])
    assert lengths.max() <= 2540 and lengths.min() >= 64
    # the clipped lognormal's mean is solved to be 1,030 exactly; a sample of ~200 lies within a few percent
    assert abs(lengths.mean() / 1030 - 1) < 0.1
