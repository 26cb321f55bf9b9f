"""Observation vector, action mask and the numpy policy router."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.core import (
    ClusterState,
    Dispatched,
    FirstToken,
    InstanceHealth,
    InstanceSpec,
    Request,
    StepsAdvanced,
)
from lbbench.routers.rl.features import Featurizer, FeatureSpec, action_mask
from lbbench.routers.rl.policy import (
    CheckpointError,
    QPolicy,
    WorkloadAwareRL,
    WorkloadGuidedRL,
    shipped_checkpoint,
)

SPEC = FeatureSpec(num_instances=3, max_num_seqs=8, min_step_s=0.02, max_model_len=2048,
                   kv_capacity_tokens=4096)


def _state(n: int = 3) -> ClusterState:
    return ClusterState([InstanceSpec(max_num_seqs=8, kv_capacity_tokens=4096)] * n)


def test_feature_values_hand_checked():
    st_ = _state()
    st_.apply(Dispatched(Request(1, 0.0, 300, 100), 0, 0.0))  # prompt b1, decode b0
    st_.apply(Dispatched(Request(2, 0.0, 10, 3000), 0, 0.0))  # prompt b0, decode b2
    st_.apply(FirstToken(2, 0, 0.1))
    st_.apply(StepsAdvanced(0, 0.2, 9))  # request 2 has 10 of 3000 tokens
    queue = [Request(5, 0.0, 100, 500), Request(6, 0.0, 1, 1)]
    x = Featurizer(SPEC)(queue, st_.view())
    names = SPEC.names()
    f = dict(zip(names, x.tolist()))
    assert x.dtype == np.float32 and x.shape == (SPEC.obs_dim,) == (2 + 3 + 3 * 10,)
    assert f["queue_len"] == pytest.approx(2 / 32)
    assert f["head_prompt"] == pytest.approx(np.log1p(100) / np.log1p(2048))
    assert (f["head_decode_b0"], f["head_decode_b1"], f["head_decode_b2"]) == (0, 1, 0)
    assert [f[f"i0_prompt_b{b}"] for b in range(3)] == [pytest.approx(1 / 8)] * 2 + [0]
    assert [f[f"i0_decode_b{b}"] for b in range(3)] == [pytest.approx(1 / 8), 0, pytest.approx(1 / 8)]
    assert f["i0_capacity"] == pytest.approx(1 - 2 / 8)
    # earliest completion: 2990 tokens * 0.02 s = 59.8 s, capped at the 10 s horizon
    assert f["i0_earliest_completion"] == 1.0
    # work: 300 prompt tokens to prefill + (100 + 2990) decode tokens left
    assert f["i0_work"] == pytest.approx(np.log1p(300 + 100 + 2990) / np.log1p(8 * 2048))
    assert f["i1_capacity"] == 1.0 and f["i1_earliest_completion"] == 0.0
    assert f["i2_healthy"] == 1.0


def test_empty_queue_features_and_mask():
    view = _state().view()
    x = Featurizer(SPEC)([], view)
    assert x[:5].tolist() == [0, 0, 0, 0, 0]
    assert action_mask([], view, 0.0).tolist() == [False, False, False, True]


def test_mask_unhealthy_and_defer_guard():
    st_ = _state()
    st_.apply(InstanceHealth(1, 0.0, False))
    q = [Request(1, 0.0, 10, 10)]
    assert action_mask(q, st_.view(), 1.0, max_defer_s=5.0).tolist() == [True, False, True, True]
    # head waited 6 s >= 5 s: must be routed
    assert action_mask(q, st_.view(), 6.0, max_defer_s=5.0).tolist() == [True, False, True, False]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4000), st.integers(1, 4000), st.integers(0, 2)),
                max_size=40), st.integers(0, 300))
def test_features_bounded_and_finite(reqs, qlen):
    st_ = _state()
    for i, (p, d, inst) in enumerate(reqs):
        st_.apply(Dispatched(Request(i, 0.0, p, d), inst, 0.0))
        if i % 2:
            st_.apply(FirstToken(i, inst, 0.1))
    queue = [Request(1000 + j, 0.0, 50, 50) for j in range(qlen)]
    x = Featurizer(SPEC)(queue, st_.view())
    assert np.isfinite(x).all() and x.min() >= -1.0 and x.max() <= 4.0


def _random_policy(spec: FeatureSpec, seed: int = 0, hidden: int = 16) -> QPolicy:
    rng = np.random.default_rng(seed)
    dims = [spec.obs_dim, hidden, hidden, spec.num_instances + 1]
    weights = [(rng.normal(size=(a, b)).astype(np.float32), rng.normal(size=b).astype(np.float32))
               for a, b in zip(dims, dims[1:])]
    meta = {"variant": "wgrl", "profile": "test", "num_instances": spec.num_instances,
            "feature_spec": spec.as_dict(), "max_defer_s": 5.0}
    return QPolicy(weights, meta)


def test_policy_roundtrip_and_forward_matches_reference(tmp_path):
    pol = _random_policy(SPEC)
    pol.save(tmp_path)
    back = QPolicy.load(tmp_path)
    x = np.random.default_rng(1).normal(size=SPEC.obs_dim).astype(np.float32)
    h = x
    for i, (w, b) in enumerate(pol.layers):
        h = h @ w + b
        if i < 2:
            h = np.maximum(h, 0)
    np.testing.assert_allclose(back.q_values(x), h, rtol=1e-5)
    assert back.meta == pol.meta


def test_router_routes_head_or_defers_and_respects_mask(tmp_path):
    _random_policy(SPEC, seed=3).save(tmp_path)
    r = WorkloadGuidedRL(3, seed=0, profile=None, checkpoint=tmp_path)
    assert r.name == "wgrl"
    st_ = _state()
    st_.apply(InstanceHealth(2, 0.0, False))
    assert r.route([], st_.view(), 0.0) is None
    for p in range(1, 2000, 97):
        q = [Request(1, 0.0, p, 3 * p), Request(2, 0.0, 5, 5)]
        d = r.route(q, st_.view(), 0.0)
        assert d is None or (d.queue_index == 0 and d.instance in (0, 1))
        # after the defer guard, it always routes
        d = r.route(q, st_.view(), 100.0)
        assert d is not None and d.instance in (0, 1)


def test_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no policy.npz"):
        WorkloadGuidedRL(3, checkpoint=tmp_path)
    _random_policy(SPEC).save(tmp_path)
    with pytest.raises(CheckpointError, match="trained for 3 instances, the run has 4"):
        WorkloadGuidedRL(4, checkpoint=tmp_path)
    with pytest.raises(CheckpointError, match="trained for wgrl, not wa_rl"):
        WorkloadAwareRL(3, checkpoint=tmp_path)
    with pytest.raises(CheckpointError, match=r"profile 'no-such-gpu' with 5 instances"):
        shipped_checkpoint("wgrl", "no-such-gpu", 5)
    with pytest.raises(CheckpointError, match=r"profile 'no-such-gpu' with 5 instances"):
        WorkloadGuidedRL(5, profile="no-such-gpu")


def test_routing_needs_no_torch(tmp_path):
    _random_policy(SPEC).save(tmp_path)
    code = (
        "import sys\n"
        "from lbbench.core import ClusterState, InstanceSpec, Request\n"
        "import lbbench.routers.rl as rl\n"
        f"r = rl.WorkloadGuidedRL(3, checkpoint={str(tmp_path)!r})\n"
        "r.route([Request(0, 0.0, 5, 5)], ClusterState([InstanceSpec()] * 3).view(), 0.0)\n"
        "assert 'torch' not in sys.modules and 'gymnasium' not in sys.modules, 'heavy import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
