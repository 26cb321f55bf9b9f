"""The calibrated paper-regime profile reproduces the paper's round robin on its setup, through the CLI.

Jain et al. (arXiv 2408.13510) measure round robin at 168 s mean E2E on 4 x V100, paper-mix, 20 req/s,
2000 requests. ``llama2-7b-v100-paper`` was calibrated on seeds 100-104; this checks the evaluation seeds 0-4.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from lbbench.cli import main
from lbbench.profiles import available_profiles, load_profile


def test_round_robin_on_the_paper_regime_gives_the_papers_168_s(tmp_path):
    res = CliRunner().invoke(main, ["run", "--profile", "llama2-7b-v100-paper", "--instances", "4", "--workload",
                                    "paper-mix", "--rate", "20", "--requests", "2000", "--router", "round_robin",
                                    "--seeds", "5", "--timeline-interval", "0", "--out", str(tmp_path / "rr"),
                                    "--format", "json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)[0]
    assert row["seeds"] == 5
    assert abs(row["mean_e2e_s"] - 168.0) <= 5.0, row["mean_e2e_s"]
    assert row["failed"] <= 5  # requests longer than the calibrated max_model_len, rejected as vLLM would


def test_paper_regime_differs_from_physics_only_in_kv_capacity_and_says_so():
    phys, cal = load_profile("llama2-7b-v100"), load_profile("llama2-7b-v100-paper")
    assert {"llama2-7b-v100", "llama2-7b-v100-paper"} <= set(available_profiles())
    assert cal.num_kv_blocks < phys.num_kv_blocks
    assert cal.max_model_len == cal.num_kv_blocks * cal.block_size  # vLLM: max_model_len fits the KV cache
    same = ("base_s", "prefill_token_s", "decode_seq_s", "context_token_s", "block_size", "max_num_seqs",
            "max_num_batched_tokens", "chunked_prefill", "scheduler", "grad1", "grad2", "epsilon", "alpha",
            "min_step_s")
    assert {k: getattr(cal, k) for k in same} == {k: getattr(phys, k) for k in same}
    src = cal.source
    assert "168 s" in src["calibrated"] and "seeds 100-104" in src["calibrated"]
    assert "calibrated, not derived" in src["num_kv_blocks"] and "preemptions" in src["num_kv_blocks"]
