"""The out-of-distribution guard, checkpoint selection by workload, and
training on a trace end to end through the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.core import (ClusterState, Dispatched, FirstToken, InstanceHealth, InstanceSpec, Request,
                          StepsAdvanced)
from lbbench.routers.mixing import MixingParams, least_impact_instance, penalties
from lbbench.routers.rl import policy as pol_mod
from lbbench.routers.rl.features import FeatureSpec
from lbbench.routers.rl.policy import CheckpointError, QPolicy, WorkloadGuidedRL, workload_slug

SPEC = FeatureSpec(num_instances=3, max_num_seqs=8, min_step_s=0.02, max_model_len=2048,
                   kv_capacity_tokens=4096)
MIX = {"grad1": 3.2e-4, "grad2": 3.3e-5, "epsilon": 0.05, "alpha": 0.5, "estimator": "paper"}


def _policy(low: float, high: float, defer_bias: float = 0.0) -> QPolicy:
    """A network whose greedy choice is always instance 2 (or defer), with a
    recorded training-state range [low, high] in every feature."""
    d = SPEC.obs_dim
    w0 = np.zeros((d, 4), np.float32)
    b2 = np.array([0.0, 0.0, 1.0, defer_bias], np.float32)
    weights = [(w0, np.zeros(4, np.float32)), (np.eye(4, dtype=np.float32), np.zeros(4, np.float32)),
               (np.eye(4, dtype=np.float32), b2)]
    meta = {"variant": "wgrl", "profile": "test", "num_instances": 3, "feature_spec": SPEC.as_dict(),
            "max_defer_s": 5.0, "mixing": MIX, "obs_low": [low] * d, "obs_high": [high] * d}
    return QPolicy(weights, meta)


def _busy_state() -> ClusterState:
    st = ClusterState([InstanceSpec(max_num_seqs=8, kv_capacity_tokens=4096)] * 3)
    st.apply(Dispatched(Request(1, 0.0, 900, 100), 2, 0.0))  # instance 2 holds the most KV
    st.apply(Dispatched(Request(2, 0.0, 100, 100), 1, 0.0))
    st.apply(FirstToken(2, 1, 0.1))
    st.apply(StepsAdvanced(1, 0.2, 9))
    return st


def test_in_distribution_states_use_the_network(tmp_path):
    _policy(-10.0, 10.0).save(tmp_path)
    r = WorkloadGuidedRL(3, checkpoint=tmp_path)
    d = r.route([Request(5, 0.0, 200, 50)], _busy_state().view(), 0.0)
    assert d.instance == 2 and r.num_fallbacks == 0 and r.num_decisions == 1


def test_out_of_distribution_states_fall_back_to_the_guidance_heuristic(tmp_path):
    _policy(0.0, 0.0).save(tmp_path)  # trained only on the all-zero state
    r = WorkloadGuidedRL(3, checkpoint=tmp_path)
    view = _busy_state().view()
    head = Request(5, 0.0, 200, 50)
    d = r.route([head], view, 0.0)
    expected = least_impact_instance(penalties(MixingParams(3.2e-4, 3.3e-5, 0.05, 0.5), view, head))
    assert expected == 0  # the empty instance, not the network's instance 2
    assert d.instance == expected and r.num_fallbacks == 1
    # the guard can be switched off
    off = WorkloadGuidedRL(3, checkpoint=tmp_path, ood_guard=False)
    assert off.route([head], view, 0.0).instance == 2 and off.num_fallbacks == 0


def test_validation_gate_routes_with_the_heuristic_when_it_validated_better(tmp_path):
    pol = _policy(-10.0, 10.0)  # in distribution everywhere: only the gate can hand over
    pol.meta["gate"] = "heuristic"
    pol.save(tmp_path)
    view = _busy_state().view()
    head = Request(5, 0.0, 200, 50)
    gated = WorkloadGuidedRL(3, checkpoint=tmp_path)
    assert gated.route([head], view, 0.0).instance == 0 and gated.num_fallbacks == 1
    assert gated.route([], view, 0.0) is None
    down = _busy_state()
    for i in range(3):
        down.apply(InstanceHealth(i, 0.0, False))
    assert gated.route([head], down.view(), 0.0) is None  # nothing healthy: defer, not a dead instance
    forced = WorkloadGuidedRL(3, checkpoint=tmp_path, gate=False)
    assert forced.route([head], view, 0.0).instance == 2 and forced.num_fallbacks == 0
    pol.meta["gate"] = "network"
    pol.save(tmp_path)
    assert WorkloadGuidedRL(3, checkpoint=tmp_path).route([head], view, 0.0).instance == 2


def test_scheduler_guard_routes_with_the_heuristic_on_engines_of_another_scheduler(tmp_path):
    pol = _policy(-10.0, 10.0)
    pol.meta["gate"] = "network"
    pol.meta["trained_on"] = {"instance_scheduler": "fcfs"}
    pol.save(tmp_path)
    view = _busy_state().view()
    head = Request(5, 0.0, 200, 50)
    same = WorkloadGuidedRL(3, checkpoint=tmp_path, instance_scheduler="fcfs")
    assert same.scheduler_mismatch is None and same.route([head], view, 0.0).instance == 2
    other = WorkloadGuidedRL(3, checkpoint=tmp_path, instance_scheduler="priority")
    assert other.scheduler_mismatch == ("fcfs", "priority") and other.heuristic_only
    assert other.route([head], view, 0.0).instance == 0 and other.num_fallbacks == 1
    forced = WorkloadGuidedRL(3, checkpoint=tmp_path, instance_scheduler="priority", gate=False)
    assert not forced.heuristic_only and forced.route([head], view, 0.0).instance == 2
    from lbbench.experiment.units import gate_note
    assert "trained against fcfs engines and the run's are priority" in gate_note("wgrl", other)


def test_shipped_checkpoint_prefers_the_workload_it_was_trained_on(tmp_path, monkeypatch):
    monkeypatch.setattr(pol_mod, "SHIPPED_DIR", tmp_path)
    _policy(-10, 10).save(tmp_path / "wgrl" / "tiny-3x")
    assert pol_mod.shipped_checkpoint("wgrl", "tiny", 3, "trace:Azure_conv.csv") == tmp_path / "wgrl" / "tiny-3x"
    _policy(-10, 10).save(tmp_path / "wgrl" / "tiny-3x-azure_conv")
    assert (pol_mod.shipped_checkpoint("wgrl", "tiny", 3, "trace:Azure_conv.csv")
            == tmp_path / "wgrl" / "tiny-3x-azure_conv")
    assert pol_mod.shipped_checkpoint("wgrl", "tiny", 3, "paper-mix") == tmp_path / "wgrl" / "tiny-3x"
    with pytest.raises(CheckpointError, match=r"shipped: tiny-3x, tiny-3x-azure_conv\); train one with "
                                              r"`lbbench train --router wgrl --profile tiny --instances 4"):
        pol_mod.shipped_checkpoint("wgrl", "tiny", 4)
    # engine mode: a -chunked checkpoint for runs with chunked prefill on, the others as fallback
    assert pol_mod.shipped_checkpoint("wgrl", "tiny", 3, None, chunked_prefill=True) == tmp_path / "wgrl" / "tiny-3x"
    _policy(-10, 10).save(tmp_path / "wgrl" / "tiny-3x-chunked")
    assert (pol_mod.shipped_checkpoint("wgrl", "tiny", 3, "paper-mix", chunked_prefill=True)
            == tmp_path / "wgrl" / "tiny-3x-chunked")
    assert (pol_mod.shipped_checkpoint("wgrl", "tiny", 3, "trace:Azure_conv.csv", chunked_prefill=True)
            == tmp_path / "wgrl" / "tiny-3x-chunked")
    assert pol_mod.shipped_checkpoint("wgrl", "tiny", 3, "paper-mix") == tmp_path / "wgrl" / "tiny-3x"
    _policy(-10, 10).save(tmp_path / "wgrl" / "tiny-3x-chunked-azure_conv")
    assert (pol_mod.shipped_checkpoint("wgrl", "tiny", 3, "trace:Azure_conv.csv", chunked_prefill=True)
            == tmp_path / "wgrl" / "tiny-3x-chunked-azure_conv")
    assert workload_slug("trace:Some-Trace.parquet") == "some_trace"
    assert workload_slug("paper-mix") == "paper_mix"


def _azure_csv(path, n=80):
    rng = np.random.default_rng(0)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    t = 0.0
    for _ in range(n):
        t += float(rng.exponential(0.5))
        lines.append(f"2023-11-16 18:{15 + int(t) // 60:02d}:{int(t) % 60:02d}.{int((t % 1) * 1e6):06d}0,"
                     f"{int(rng.integers(10, 400))},{int(rng.integers(5, 200))}")
    path.write_text("\n".join(lines) + "\n")


def test_train_on_a_trace_then_run_with_the_checkpoint(tmp_path):
    trace = tmp_path / "mini_azure.csv"
    _azure_csv(trace)
    out = tmp_path / "ckpt"
    runner = CliRunner()
    res = runner.invoke(main, [
        "train", "--recipe", "paper", "--router", "wgrl", "--profile", "llama3.1-8b-a100-v0", "--instances", "2",
        "--trace", str(trace), "--max-prompt-tokens", "300", "--rate", "4", "--requests", "30",
        "--predictor", "noisy:0.79", "--episodes", "2", "--explore-episodes", "1",
        "--learning-starts", "16", "--batch-size", "16", "--buffer-size", "1000", "--val-seeds", "1",
        "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "on trace:mini_azure.csv" in res.output
    meta = QPolicy.load(out).meta
    assert meta["trained_on"]["workload"] == "trace:mini_azure.csv"
    assert meta["trained_on"]["predictor"] == "noisy:0.79" and meta["trained_on"]["rate_per_s"] == 4.0
    assert meta["train_config"]["trace_options"]["max_prompt_tokens"] == 300
    res = runner.invoke(main, ["run", "--profile", "llama3.1-8b-a100-v0", "--instances", "2",
                               "--trace", str(trace), "--rate", "4", "--router", "round_robin,wgrl",
                               "--checkpoint", str(out), "--format", "json", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output


def test_run_without_a_matching_checkpoint_says_how_to_train_one(tmp_path):
    res = CliRunner().invoke(main, ["run", "--profile", "llama2-7b-v100", "--instances", "7",
                                    "--router", "wgrl", "--requests", "10", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2
    assert "no shipped checkpoint for profile 'llama2-7b-v100' with 7 instances" in res.output
    assert "lbbench train --router wgrl" in res.output


def test_run_says_when_a_checkpoint_routes_with_its_heuristic(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from lbbench.routers.rl.features import FeatureSpec as FS
    from lbbench.profiles import load_profile

    prof = load_profile("llama2-7b-v100")
    spec = FS.from_profile(prof, 3)
    d = spec.obs_dim
    w = [(np.zeros((d, 4), np.float32), np.zeros(4, np.float32))]
    meta = {"variant": "wgrl", "profile": prof.name, "num_instances": 3, "feature_spec": spec.as_dict(),
            "max_defer_s": 5.0, "mixing": MIX, "gate": "heuristic",
            "validation": {"network_e2e_s": 12.5, "heuristic_e2e_s": 9.25, "seeds": [999997, 999996]}}
    QPolicy(w, meta).save(tmp_path / "ck")
    exe = str(Path(sys.executable).with_name("lbbench"))
    res = subprocess.run([exe, "run", "--profile", prof.name, "--instances", "3", "--workload", "paper-mix",
                          "--rate", "5", "--requests", "20", "--router", "round_robin,wgrl", "--checkpoint",
                          f"wgrl={tmp_path / 'ck'}", "--out", str(tmp_path / "run")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    note = " ".join(res.stderr.split())
    assert "wgrl: checkpoint" in note and "routes with its guidance heuristic" in note
    assert "the network gave 12.5 s mean E2E, the heuristic 9.2 s" in note and "wgrl.gate=false" in note
