"""The permutation-equivariant Q-network (``--network shared``): the numpy
forward pass matches torch's, relabelling instances relabels the Q-values, and a
trained checkpoint routes through the simulator."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.routers.rl.features import FeatureSpec
from lbbench.routers.rl.policy import CheckpointError, SharedQPolicy, WorkloadGuidedRL, load_policy
from lbbench.sim.cluster import ClusterSim
from lbbench.training import trainer as tr
from lbbench.training.rounds import train

from tests_rl_helpers import PROFILE, small_workload, use_small_workloads  # noqa: E402

SPEC = FeatureSpec(num_instances=3, max_num_seqs=8, min_step_s=0.02, max_model_len=2048,
                   kv_capacity_tokens=4096)
HEAD = SPEC.obs_dim - SPEC.num_instances * SPEC.per_instance_dim


def _net(seed: int = 0) -> tr.SharedQNetwork:
    torch.manual_seed(seed)
    return tr.SharedQNetwork(HEAD, SPEC.num_instances, SPEC.per_instance_dim, 16)


def _policy(seed: int = 0) -> SharedQPolicy:
    meta = {"variant": "wgrl", "num_instances": 3, "feature_spec": SPEC.as_dict(), "max_defer_s": 5.0}
    return tr.export_policy(_net(seed), meta)


def test_numpy_forward_matches_torch_and_roundtrips(tmp_path):
    net, pol = _net(1), _policy(1)
    x = np.random.default_rng(0).normal(size=(5, SPEC.obs_dim)).astype(np.float32)
    with torch.no_grad():
        ref = net(torch.from_numpy(x)).numpy()
        one = net(torch.from_numpy(x[0])).numpy()
    assert ref.shape == (5, 4) and one.shape == (4,)
    np.testing.assert_allclose(one, ref[0], rtol=1e-5, atol=1e-6)
    pol.save(tmp_path)
    back = load_policy(tmp_path)
    assert isinstance(back, SharedQPolicy) and back.meta == pol.meta
    assert back.meta["network"] == {"arch": "shared", "head_dim": HEAD, "num_instances": 3,
                                    "per_instance_dim": SPEC.per_instance_dim}
    for row, want in zip(x, ref):
        np.testing.assert_allclose(back.q_values(row), want, rtol=1e-4, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(perm=st.permutations(range(3)), seed=st.integers(0, 2**16))
def test_relabelling_instances_relabels_q_values(perm, seed):
    """Equivariance: instance block j of the new state is block perm[j] of the old,
    so Q_new[j] = Q_old[perm[j]] and defer's value is unchanged."""
    pol = _policy(0)
    x = np.random.default_rng(seed).normal(size=SPEC.obs_dim).astype(np.float32)
    k = SPEC.per_instance_dim
    blocks = x[HEAD:].reshape(3, k)
    y = np.concatenate([x[:HEAD], blocks[list(perm)].reshape(-1)])
    qx, qy = pol.q_values(x), pol.q_values(y)
    np.testing.assert_allclose(qy[:3], qx[list(perm)], rtol=1e-5, atol=1e-6)
    assert qy[3] == pytest.approx(qx[3], rel=1e-5, abs=1e-6)


def test_bad_shared_metadata_is_a_checkpoint_error(tmp_path):
    pol = _policy()
    bad = dict(pol.meta, network={"arch": "shared", "head_dim": HEAD + 1, "num_instances": 3,
                                  "per_instance_dim": SPEC.per_instance_dim})
    with pytest.raises(CheckpointError, match="input widths"):
        SharedQPolicy(pol.instance_layers, pol.defer_layers, bad)
    pol.meta["network"]["arch"] = "transformer"
    pol.save(tmp_path)
    with pytest.raises(CheckpointError, match="unknown network"):
        load_policy(tmp_path)


def test_trains_and_routes(tmp_path, monkeypatch):
    use_small_workloads(monkeypatch)
    cfg = tr.TrainConfig(router="wgrl", profile="tiny", instances=3, episodes=3, requests=40,
                         explore_episodes=2, learning_starts=32, batch_size=32, target_every=50,
                         buffer_size=5000, network="shared")
    train(cfg, tmp_path, progress=False, profile=PROFILE)
    router = WorkloadGuidedRL(3, checkpoint=tmp_path)
    assert isinstance(router.policy, SharedQPolicy)
    recs = ClusterSim(PROFILE, 3, small_workload(99)).run(router)
    assert len(recs) == 40 and all(r.finish_s is not None for r in recs)
    with pytest.raises(ValueError, match="network"):
        tr.make_network(dataclasses.replace(cfg, network="cnn"), SPEC)


def test_heuristic_prior_hand_values_and_a_flat_network_acts_as_the_heuristic(tmp_path, monkeypatch):
    """Residual Q (a checkpoint whose metadata has ``prior_scale`` K; training no longer makes
    them): prior 0 for the least mixing impact, -K for the largest among the valid instances,
    linear between, -K for defer; with a network whose values are flat the router picks exactly
    the heuristic's instance."""
    from lbbench.core import ClusterState, Dispatched, InstanceSpec, Request
    from lbbench.routers.mixing import MixingParams, heuristic_prior, least_impact_instance, penalties

    assert heuristic_prior([3.0, 1.0, 2.0], [True, True, True], 0.5) == [-0.5, 0.0, -0.25, -0.5]
    assert heuristic_prior([3.0, 1.0, 2.0], [True, False, True], 2.0) == [-2.0, -2.0, 0.0, -2.0]
    assert heuristic_prior([1.0, 1.0], [True, True], 1.0) == [0.0, 0.0, -1.0]

    use_small_workloads(monkeypatch)
    cfg = tr.TrainConfig(router="wgrl", profile="tiny", instances=3, episodes=2, requests=40,
                         explore_episodes=1, learning_starts=32, batch_size=32, target_every=50,
                         buffer_size=5000, network="shared")
    train(cfg, tmp_path, progress=False, profile=PROFILE)
    pol = load_policy(tmp_path)
    assert "prior_scale" not in pol.meta and len(pol.meta["obs_low"]) == pol.obs_dim
    pol.meta["prior_scale"] = 1.0
    for layers in (pol.instance_layers, pol.defer_layers):  # flatten the network: constant values
        w, b = layers[-1]
        layers[-1] = (np.zeros_like(w), np.zeros_like(b))
    pol.meta["gate"] = "network"
    pol.save(tmp_path / "flat")
    router = WorkloadGuidedRL(3, checkpoint=tmp_path / "flat", ood_guard=False)
    st_ = ClusterState([InstanceSpec(max_num_seqs=8, kv_capacity_tokens=4096)] * 3)
    st_.apply(Dispatched(Request(1, 0.0, 900, 100), 0, 0.0))
    st_.apply(Dispatched(Request(2, 0.0, 300, 100), 2, 0.0))
    head = Request(5, 0.0, 200, 50)
    mix = MixingParams(**{k: pol.meta["mixing"][k] for k in ("grad1", "grad2", "epsilon", "alpha")})
    want = least_impact_instance(penalties(mix, st_.view(), head))
    assert want == 1 and router.route([head], st_.view(), 0.0).instance == want
