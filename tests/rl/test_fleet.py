"""The RL router on mixed fleets: capacity features, training on a fleet, the shipped F1 checkpoint."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lbbench.core import ClusterState, Dispatched, FirstToken, InstanceSpec, Request, StepsAdvanced
from lbbench.fleet import parse_fleet
from lbbench.profiles import load_profile
from lbbench.routers.rl.features import Featurizer, FeatureSpec
from lbbench.routers.rl.policy import (SHIPPED_DIR, CheckpointError, WorkloadGuidedRL, load_policy,
                                       shipped_fleet_checkpoint)
from lbbench.sim.cluster import ClusterSim

FAST = InstanceSpec(max_num_seqs=8, kv_capacity_tokens=8000, min_step_s=0.01, batch_decode_tokens_per_s=1000.0,
                    prefill_tokens_per_s=10000.0)
SLOW = InstanceSpec(max_num_seqs=4, kv_capacity_tokens=2000, min_step_s=0.04, batch_decode_tokens_per_s=250.0,
                    prefill_tokens_per_s=2000.0)
F1 = "llama3.1-8b-a100-v0:2,llama3.1-8b-l4-v0:2"
F1_DIR = SHIPPED_DIR / "wgrl" / "llama3.1-8b-f1-a100x2-l4x2"


def _spec(**kw) -> FeatureSpec:
    return FeatureSpec(num_instances=2, max_num_seqs=8, min_step_s=0.01, max_model_len=2048,
                       kv_capacity_tokens=8000, **kw)


def test_capacity_features_off_by_default_keep_the_old_shape():
    plain = _spec()
    assert plain.obs_dim == 2 + 3 + 2 * 10 and "capacity_features" not in plain.as_dict()
    with_kv = _spec(kv_features=True)
    assert with_kv.obs_dim == 2 + 3 + 1 + 2 * 13 and "capacity_features" not in with_kv.as_dict()
    cap = _spec(kv_features=True, capacity_features=True)
    assert cap.obs_dim == with_kv.obs_dim + 2 * 4
    assert FeatureSpec.from_dict(cap.as_dict()) == cap
    assert cap.names()[-4:] == ["i1_decode_speed", "i1_prefill_speed", "i1_kv_capacity", "i1_drain_time"]


def test_capacity_features_hand_computed_on_two_instances():
    st = ClusterState([FAST, SLOW])
    st.apply(Dispatched(Request(1, 0.0, 400, 100), 1, 0.0))  # waits for its prefill on the slow one
    st.apply(Dispatched(Request(2, 0.0, 100, 300), 1, 0.0))
    st.apply(FirstToken(2, 1, 0.1))
    st.apply(StepsAdvanced(1, 0.2, 49))  # request 2 has 50 of 300 tokens
    queue = [Request(5, 0.0, 200, 800)]
    spec = _spec(kv_features=True, capacity_features=True)
    x = Featurizer(spec)(queue, st.view())
    f = dict(zip(spec.names(), x.tolist()))
    assert x.shape == (spec.obs_dim,) and x.dtype == np.float32
    # relative to the fleet's fastest and largest
    assert (f["i0_decode_speed"], f["i0_prefill_speed"], f["i0_kv_capacity"]) == (1.0, 1.0, 1.0)
    assert f["i1_decode_speed"] == pytest.approx(0.25)
    assert f["i1_prefill_speed"] == pytest.approx(0.2)
    assert f["i1_kv_capacity"] == pytest.approx(0.25)
    # drain: 400 prompt tokens at 2000/s + (100 + 250) decode tokens at 250/s = 0.2 + 1.4 s
    assert f["i1_drain_time"] == pytest.approx(math.log1p(1.6) / math.log1p(600.0), rel=1e-6)
    assert f["i0_drain_time"] == 0.0
    # counts and KV in the slow instance's own limits (4 sequences, 2000 tokens)
    assert f["i1_capacity"] == pytest.approx(1 - 2 / 4)
    assert f["i1_prompt_b1"] == pytest.approx(1 / 4)
    assert f["i1_kv_footprint"] == pytest.approx((500 + 400) / 2000)
    assert f["i1_kv_fit"] == pytest.approx(1 - 900 / 2000 - 1000 / 2000)
    assert f["i0_kv_fit"] == pytest.approx(1 - 1000 / 8000)
    assert f["head_kv"] == pytest.approx(1000 / 8000)
    # without capacity features the same view gives the old vector, a prefix of nothing new
    old = Featurizer(_spec(kv_features=True))(queue, st.view())
    assert old.shape == (_spec(kv_features=True).obs_dim,)


def test_fleet_spec_of_a_uniform_fleet_is_the_profile_spec():
    a100, l4 = load_profile("llama3.1-8b-a100-v0"), load_profile("llama3.1-8b-l4-v0")
    assert FeatureSpec.from_profiles([a100] * 3) == FeatureSpec.from_profile(a100, 3)
    mixed = FeatureSpec.from_profiles([a100, l4], capacity_features=True)
    assert mixed.kv_capacity_tokens == max(a100.kv_capacity_tokens, l4.kv_capacity_tokens)
    assert mixed.min_step_s == min(a100.min_step_s, l4.min_step_s)


def test_router_teacher_follows_its_heuristic():
    from lbbench.routers.registry import get_router
    from lbbench.training.teachers import make_teacher

    fleet = parse_fleet("llama3.1-8b-a100-v0:1,llama3.1-8b-l4-v0:1")
    reqs = [Request(i, 0.05 * i, 300, 200, predicted_output_tokens=200) for i in range(6)]
    teacher = make_teacher("least_work_speed", fleet.profiles()[0])
    router = get_router("least_work_speed", num_instances=2)
    sim = ClusterSim.for_fleet(fleet, reqs)
    while not sim.done:
        sim.advance(sim.next_arrival_s if not sim.queue else sim.now_s)
        if sim.queue:
            want = router.route(sim.queue, sim.view(), sim.now_s).instance
            assert teacher(sim) == want
            sim.dispatch(0, want)
        elif math.isinf(sim.next_arrival_s):
            break


def test_training_on_a_two_instance_mixed_fleet_smoke(tmp_path, monkeypatch):
    from lbbench.training.config import recipe
    from lbbench.training.rounds import train

    cfg = recipe("imitation", fleet="llama3.1-8b-a100-v0:1,llama3.1-8b-l4-v0:1", rate=20.0, requests=30, episodes=2,
                 workers=0, bc_episodes=1, dagger_rounds=1, imitation_updates=10, learning_starts=8, batch_size=16,
                 buffer_size=2000, val_seeds=1, eval_every=2, capacity_features=True, teacher="least_work_speed")
    curve = train(cfg, tmp_path, progress=False)
    assert curve["phase"].to_list() == ["bc", "dagger", "rl", "rl"]
    pol = load_policy(tmp_path)
    assert pol.meta["fleet"] == pol.meta["trained_on"]["fleet"] == cfg.fleet
    assert pol.meta["num_instances"] == 2 and pol.meta["feature_spec"]["capacity_features"] is True
    assert pol.meta["fallback"] == "least_work_speed"  # the OOD guard and the gate fall back to the teacher
    import polars as pl
    lc = pl.read_parquet(tmp_path / "learning_curve.parquet")
    assert {"network", "heuristic", "round_robin", "least_work_speed"} <= set(lc["policy"].to_list())
    # the checkpoint routes the fleet it was trained on
    fleet = parse_fleet(cfg.fleet)
    reqs = [Request(i, 0.1 * i, 200, 50, predicted_output_tokens=60) for i in range(20)]
    router = WorkloadGuidedRL(2, checkpoint=tmp_path, gate=False)
    recs = ClusterSim.for_fleet(fleet, reqs).run(router)
    assert all(r.finish_s is not None for r in recs) and router.num_decisions >= 20
    # gated to its heuristic, the router routes exactly as its fallback router
    from lbbench.routers.registry import get_router
    gated = WorkloadGuidedRL(2, checkpoint=tmp_path, instance_scheduler="priority")
    assert gated.heuristic_only
    a = ClusterSim.for_fleet(fleet, reqs).run(gated)
    b = ClusterSim.for_fleet(fleet, reqs).run(get_router("least_work_speed", num_instances=2))
    assert [r.instance for r in a] == [r.instance for r in b]


def test_cli_refuses_a_bad_fleet(tmp_path):
    from click.testing import CliRunner

    from lbbench.cli.train import train

    res = CliRunner().invoke(train, ["--fleet", "llama3.1-8b-a100-v0:x", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--fleet" in res.output


@pytest.mark.skipif(not (F1_DIR / "policy.npz").is_file(), reason="the F1 checkpoint is not shipped")
def test_shipped_f1_checkpoint_routes_the_mixed_fleet():
    assert shipped_fleet_checkpoint("wgrl", parse_fleet(F1)) == F1_DIR
    assert shipped_fleet_checkpoint("wgrl", F1.replace(",", ", ")) == F1_DIR
    router = WorkloadGuidedRL(4, fleet=parse_fleet(F1), gate=False)
    assert Path(router.checkpoint) == F1_DIR and router.spec.capacity_features
    reqs = [Request(i, 0.02 * i, 300, 120, predicted_output_tokens=100) for i in range(60)]
    recs = ClusterSim.for_fleet(parse_fleet(F1), reqs).run(router)
    assert all(r.finish_s is not None for r in recs)
    assert len({r.instance for r in recs}) >= 2
    with pytest.raises(CheckpointError, match="no shipped checkpoint for fleet"):
        shipped_fleet_checkpoint("wgrl", "llama3.1-8b-a100-v0:1,llama3.1-8b-l4-v0:3")


def test_gated_fleet_checkpoint_reports_its_fallback_routers_scores(tmp_path):
    from lbbench.routers.registry import get_router

    if not (F1_DIR / "policy.npz").is_file():
        pytest.skip("the F1 checkpoint is not shipped")
    from lbbench.experiment.units import gate_note

    router = WorkloadGuidedRL(4, checkpoint=F1_DIR, instance_scheduler="priority")  # the scheduler guard: gated
    assert router.heuristic_only and router.fallback is not None
    assert "routes with its fallback router least_work_speed" in gate_note("wgrl", router)
    st = ClusterState(parse_fleet(F1).instance_specs())
    st.apply(Dispatched(Request(1, 0.0, 400, 100, predicted_output_tokens=90), 2, 0.0))
    queue = [Request(5, 0.0, 200, 800, predicted_output_tokens=700)]
    view = st.view()
    assert router.queue_scores(queue, view, 0.0) == get_router("least_work_speed", num_instances=4).scores(
        queue[0], view)


def test_fleet_lookup_prefers_the_runs_engine_scheduler(tmp_path, monkeypatch):
    import json

    from lbbench.routers.rl import policy as pol

    def ship(name, fleet, sched=None):
        d = tmp_path / "wgrl" / name
        d.mkdir(parents=True)
        cfg = {"fleet": fleet} | ({"instance_scheduler": sched} if sched else {})
        (d / "config.json").write_text(json.dumps(cfg))
        (d / pol.POLICY_FILE).write_bytes(b"")
        return d

    monkeypatch.setattr(pol, "SHIPPED_DIR", tmp_path)
    fcfs = ship("f1", F1, "fcfs")
    prio = ship("f1-priority", F1, "priority")
    ship("other", "llama3.1-8b-a100-v0:1,llama3.1-8b-l4-v0:3", "priority")
    assert shipped_fleet_checkpoint("wgrl", F1) == fcfs  # no scheduler named: the FCFS one, as before
    assert shipped_fleet_checkpoint("wgrl", F1, "fcfs") == fcfs
    assert shipped_fleet_checkpoint("wgrl", parse_fleet(F1), "priority") == prio
    assert shipped_fleet_checkpoint("wgrl", F1, "bin_packing") == fcfs  # none for it: FCFS (then gated)
    (fcfs / "config.json").write_text(json.dumps({"fleet": F1}))  # no recorded scheduler: FCFS, the default
    assert shipped_fleet_checkpoint("wgrl", F1, "fcfs") == fcfs
    (fcfs / pol.POLICY_FILE).unlink()
    assert shipped_fleet_checkpoint("wgrl", F1) == prio  # the only one left for the fleet
    with pytest.raises(CheckpointError, match="shipped fleets: .*l4-v0:2; .*l4-v0:3"):
        shipped_fleet_checkpoint("wgrl", "llama3.1-8b-a100-v0:3,llama3.1-8b-l4-v0:1")
