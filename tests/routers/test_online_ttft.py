"""``online_ttft``: the online TTFT model (hand-computed RLS step, convergence property), a hand-computed decision
that the learned weights change, learning from first tokens, and end-to-end runs (simulator and CLI)."""

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.cli import main
from lbbench.core import ClusterState, Dispatched, FirstToken, InstanceSpec, Request
from lbbench.routers import available_routers, get_router
from lbbench.routers.online_ttft import FEATURES, OnlineLinear
from factories import run_sessions, tiny_profile


def hreq(i, prompt=640, out=8, hashes=tuple(range(40))):
    return Request(i, 0.0, prompt, out, prefix_hashes=tuple(hashes) if hashes else None, prefix_block_tokens=16)


def test_rls_step_hand_computed():
    m = OnlineLinear(np.zeros(2), prior_var=1.0, forget=1.0)
    m.update(np.array([1.0, 1.0]), 2.0)
    # P x = (1, 1), x P x = 2, gain k = (1/3, 1/3), error 2 -> w = (2/3, 2/3); P = I - k (P x)^T
    assert m.w == pytest.approx([2 / 3, 2 / 3])
    assert m.P == pytest.approx(np.array([[2 / 3, -1 / 3], [-1 / 3, 2 / 3]]))
    with pytest.raises(ValueError, match="forget"):
        OnlineLinear(np.zeros(2), 1.0, 1.5)


@settings(max_examples=25, deadline=None)
@given(w_true=st.lists(st.floats(-2, 2), min_size=3, max_size=3), seed=st.integers(0, 10_000))
def test_rls_recovers_a_linear_law(w_true, seed):
    """Noise-free data from y = w* . x: with no forgetting and a weak prior RLS ends at w*."""
    rng = np.random.default_rng(seed)
    m = OnlineLinear(np.zeros(3), prior_var=1e6, forget=1.0)
    for _ in range(40):
        x = np.concatenate([[1.0], rng.uniform(0, 3, 2)])
        m.update(x, float(np.dot(w_true, x)))
    assert m.w == pytest.approx(w_true, abs=1e-3)
    assert np.allclose(m.P, m.P.T, atol=1e-9) and np.all(np.linalg.eigvalsh((m.P + m.P.T) / 2) > 0)


def _two_instances(**kw):
    """Instance 0 holds the 640-token prompt and has 1000 uncached tokens queued; instance 1 is empty."""
    prof = tiny_profile(prefill_token_s=1e-3, num_kv_blocks=1000)
    r = get_router("online_ttft", num_instances=2, profile=prof, decode_weight=0.0, **kw)
    r.trees.insert(0, hreq(100))
    r.prefill.dispatched(hreq(101, prompt=1000, hashes=None), 0, 1000)
    return r, ClusterState([InstanceSpec(kv_capacity_tokens=100_000)] * 2).view()


def test_decision_hand_computed_and_moved_by_the_learned_weights():
    # tiny profile: base_s 0.01, prefill_token_s 1e-3 -> prior weights bias 0.01, own 1, queued 1 (per 1000 tokens)
    r, v = _two_instances()
    assert r.model.w == pytest.approx([0.01, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    # instance 0: hit 639 (never the last token), own 1, queued 1000: 0.01 + 0.001 + 1.0 = 1.011 s, less the hit's
    # extra weight (hit_weight 1.5): 0.5 x 639 x 1e-3 = 0.3195 -> 0.6915; instance 1: own 640, queued 0:
    # 0.01 + 0.64 = 0.65 s -> instance 1
    assert r.route([hreq(1)], v, 0.0).instance == 1
    # the model has learned that queued prefill costs a tenth of the prior's figure (V1: it overlaps decodes)
    r, v = _two_instances()
    r.model.w = np.array([0.01, 1.0, 0.1, 0.0, 0.0, 0.0, 1.0])
    # instance 0: 0.01 + 0.001 + 0.1 - 0.3195 = -0.2085; instance 1: 0.65 s -> instance 0
    assert r.hit_weight == 1.5
    assert r.route([hreq(2)], v, 0.0).instance == 0


def test_it_learns_from_first_tokens():
    prof = tiny_profile(prefill_token_s=1e-3, num_kv_blocks=1000)
    r = get_router("online_ttft", num_instances=2, profile=prof, curve_every=2)
    st_ = ClusterState([InstanceSpec(kv_capacity_tokens=100_000)] * 2)
    a = hreq(1, prompt=100, hashes=None)
    inst = r.route([a], st_.view(), 0.0).instance
    st_.apply(Dispatched(a, inst, 0.0))
    prior = 0.01 + 0.1  # bias + 100 uncached tokens x 1e-3
    r.on_event(FirstToken(1, inst, 0.5))
    assert r.model.num_updates == 1
    assert r.learning_curve() == [{"first_tokens": 1, "model_mae_s": pytest.approx(0.5 - prior),
                                   "prior_mae_s": pytest.approx(0.5 - prior)}]
    assert r.model.predict(r.features(st_.view().instances[inst], 100, 0, 0.0)) > prior  # moved towards 0.5
    assert "online_ttft: 1 updates" in r.run_notes()[0] and FEATURES[0] in r.run_notes()[1]


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 4), down=st.sets(st.integers(0, 3)), loads=st.lists(st.integers(0, 40), min_size=4,
                                                                             max_size=4))
def test_returns_a_valid_healthy_instance(n, down, loads):
    from lbbench.core import InstanceHealth
    st_ = ClusterState([InstanceSpec(kv_capacity_tokens=10_000)] * n)
    for i, k in enumerate(loads[:n]):
        for j in range(k):
            st_.apply(Dispatched(hreq(1000 * (i + 1) + j, prompt=32, hashes=None), i, 0.0))
    down = {d for d in down if d < n}
    for d in down:
        st_.apply(InstanceHealth(d, 0.0, False))
    d = get_router("online_ttft", num_instances=n, profile=tiny_profile()).route([hreq(0)], st_.view(), 0.0)
    if len(down) == n:
        assert d is None
    else:
        assert d is not None and d.instance not in down and 0 <= d.instance < n


def test_end_to_end_in_the_simulator_learns():
    router, reqs, recs = run_sessions("online_ttft")
    assert sorted(r.request_id for r in recs) == list(range(len(reqs)))
    assert "online_ttft" in available_routers()
    assert sum(r.cached_prompt_tokens for r in recs) > 0
    assert router.model.num_updates == len(reqs)   # one update per first token
    assert sum(c["first_tokens"] - (k * router.curve_every) for k, c in enumerate(router.learning_curve())) \
        == len(reqs)


def test_cli_run(tmp_path):
    res = CliRunner().invoke(main, ["run", "--profile", "llama3.1-8b-a100", "--instances", "2", "--workload",
                                    "agentic", "--prefix-caching", "on", "--rate", "20", "--requests", "150",
                                    "--router", "online_ttft,cache_length_aware", "--predictor", "noisy:0.79",
                                    "--timeline-interval", "0", "--out", str(tmp_path / "run")],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "online_ttft: 150 updates" in res.output and "online_ttft" in res.output
    bad = CliRunner().invoke(main, ["run", "--requests", "20", "--router", "online_ttft",
                                    "--router-opt", "online_ttft.forget=2", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "forget" in bad.output
