"""The training loop without a teacher (the serial case, one worker in process): runs end to end,
is deterministic, exports a numpy policy; the learner's parts."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from lbbench.training import trainer as tr
from lbbench.training.rounds import plan_rounds, train
from lbbench.routers.rl.policy import QPolicy, WorkloadAwareRL
from lbbench.sim.cluster import ClusterSim

from tests_rl_helpers import PROFILE, small_workload, use_small_workloads  # noqa: E402  (conftest: tests/rl on path)


@pytest.fixture
def tiny_cfg(monkeypatch):
    use_small_workloads(monkeypatch)
    return tr.TrainConfig(router="wa_rl", profile="tiny", instances=3, episodes=3, requests=40,
                          explore_episodes=2, learning_starts=32, batch_size=32, target_every=50,
                          buffer_size=5000)


def test_train_writes_checkpoint_and_curve(tmp_path, tiny_cfg):
    curve = train(tiny_cfg, tmp_path, progress=False, profile=PROFILE)
    assert curve.columns[:5] == ["episode", "phase", "teacher_agreement", "reward", "mean_e2e_s"]
    assert {"loss", "q_mean", "epsilon", "updates", "val_e2e_s"} <= set(curve.columns)
    assert curve["episode"].to_list() == [0, 1, 2] and set(curve["phase"]) == {"rl"}
    assert curve["updates"][-1] > 0 and np.isfinite(curve["loss"][-1])
    assert curve["epsilon"].to_list()[-1] == 0.0
    assert pl.read_parquet(tmp_path / "curve.parquet").equals(curve)
    pol = QPolicy.load(tmp_path)
    assert pol.meta["variant"] == "wa_rl" and pol.meta["num_instances"] == 3
    assert pol.layers[0][0].shape == (pol.obs_dim, 64) and pol.num_actions == 4
    # the exported policy routes a whole workload through the batch simulator
    router = WorkloadAwareRL(3, checkpoint=tmp_path)
    recs = ClusterSim(PROFILE, 3, small_workload(99)).run(router)
    assert len(recs) == 40 and all(r.finish_s is not None for r in recs)


def test_same_seed_same_curve(tmp_path, tiny_cfg):
    a = train(tiny_cfg, tmp_path / "a", progress=False, profile=PROFILE).drop("wall_s")
    b = train(tiny_cfg, tmp_path / "b", progress=False, profile=PROFILE).drop("wall_s")
    assert a.equals(b)
    wa = np.load(tmp_path / "a" / "policy.npz")["w0"]
    wb = np.load(tmp_path / "b" / "policy.npz")["w0"]
    np.testing.assert_array_equal(wa, wb)


def test_epsilon_schedule():
    cfg = tr.TrainConfig(explore_episodes=20, epsilon_start=1.0, epsilon_end=0.05)
    assert tr.epsilon_at(cfg, 0) == 1.0
    assert tr.epsilon_at(cfg, 19) == pytest.approx(0.05)
    assert tr.epsilon_at(cfg, 20) == 0.0
    assert tr.TrainConfig(instances=8).hidden_width() == 128


def test_checkpoint_records_what_it_was_trained_on(tmp_path, tiny_cfg):
    train(tiny_cfg, tmp_path, progress=False, profile=PROFILE)
    meta = QPolicy.load(tmp_path).meta
    assert meta["trained_on"]["workload"] == "paper-mix" and meta["trained_on"]["predictor"] == "oracle"
    assert meta["mixing"]["estimator"] == "paper" and meta["mixing"]["grad1"] == PROFILE.grad1
    assert len(meta["obs_low"]) == len(meta["obs_high"]) == QPolicy.load(tmp_path).obs_dim
    assert all(lo <= hi for lo, hi in zip(meta["obs_low"], meta["obs_high"]))
    # the validation gate: network and heuristic on fresh seeds, below the selection seeds
    v = meta["validation"]
    assert v["seeds"] == [tiny_cfg.train_seed_base - 3, tiny_cfg.train_seed_base - 4]
    assert v["margin_pct"] == 1.0
    assert meta["gate"] == ("network" if v["network_e2e_s"] < 0.99 * v["heuristic_e2e_s"] else "heuristic")
    assert v["network_e2e_s"] > 0 and v["heuristic_e2e_s"] > 0


def test_options_train(tmp_path, tiny_cfg):
    """n-step returns, bootstrapping at the end, reward centering, literal schedule, per-decision
    discount, the instance-permutation augmentation all train."""
    cfg = dataclasses.replace(tiny_cfg, router="wgrl", n_step=3, bootstrap_end=True,
                              guidance_schedule="literal", discount="decision", estimator="interference", reward_centering=True,
                              episodes=2, explore_episodes=1, permute_instances=True)
    curve = train(cfg, tmp_path, progress=False, profile=PROFILE)
    assert curve.height == 2 and curve["updates"][-1] > 0 and np.isfinite(curve["loss"][-1])
    plain = train(dataclasses.replace(cfg, permute_instances=False), tmp_path / "plain", progress=False,
                  profile=PROFILE)
    assert plain["loss"][-1] != curve["loss"][-1]  # the augmentation changes what is learned


def test_a_run_of_four_episodes_evaluates_its_learning_curve_twice(tmp_path, tiny_cfg):
    cfg = dataclasses.replace(tiny_cfg, episodes=4, eval_every=5, val_seeds=1, validation_gate=False)
    train(cfg, tmp_path, progress=False, profile=PROFILE)
    lc = pl.read_parquet(tmp_path / "learning_curve.parquet")
    assert sorted(set(lc["episode"].to_list())) == [2, 4]


def test_rounds_plan_the_phases_seeds_and_dagger_schedule():
    cfg = tr.TrainConfig(teacher="kv_gate", bc_episodes=3, dagger_rounds=3, episodes=3, workers=2, seed=2,
                         seed_stride=100, dagger_beta_decay=0.4, explore_episodes=2, epsilon_start=0.5,
                         epsilon_end=0.1)
    rounds = plan_rounds(cfg)
    assert [(phase, len(tasks)) for phase, tasks in rounds] == [
        ("bc", 2), ("bc", 1), ("dagger", 2), ("dagger", 2), ("dagger", 2), ("rl", 2), ("rl", 1)]
    tasks = [t for _, ts in rounds for t in ts]
    assert [t.episode for t in tasks] == list(range(12))
    assert [t.seed for t in tasks] == [cfg.train_seed_base + 200 + k for k in range(12)]
    assert [t.beta for _, ts in rounds if _ == "dagger" for t in ts] == pytest.approx(
        [0.4, 0.4, 0.16, 0.16, 0.064, 0.064])
    rl = [t for _, ts in rounds if _ == "rl" for t in ts]
    assert [t.schedule_episode for t in rl] == [0, 1, 2] and [t.epsilon for t in rl] == pytest.approx([0.5, 0.1, 0.0])
    # the serial case: one episode a round, no imitation phases
    serial = plan_rounds(tr.TrainConfig(episodes=3, workers=0))
    assert [(phase, len(tasks)) for phase, tasks in serial] == [("rl", 1)] * 3
    assert cfg.validation_seeds(2, skip=1) == [cfg.train_seed_base - 2, cfg.train_seed_base - 3]


def test_permute_instances_relabels_consistently():
    rng = np.random.default_rng(0)
    head, m, k = 2, 3, 4
    n = 50
    obs = rng.normal(size=(n, head + m * k)).astype(np.float32)
    nxt = rng.normal(size=(n, head + m * k)).astype(np.float32)
    action = rng.integers(0, m + 1, size=n)
    mask = rng.random((n, m + 1)) < 0.5
    o2, a2, n2, mk2 = tr.permute_instances(rng, obs, action, nxt, mask, head, m, k)
    assert np.array_equal(o2[:, :head], obs[:, :head])
    for i in range(n):
        blocks, blocks2 = obs[i, head:].reshape(m, k), o2[i, head:].reshape(m, k)
        if action[i] == m:
            assert a2[i] == m
        else:  # the chosen instance's features moved with the action
            assert np.array_equal(blocks2[a2[i]], blocks[action[i]])
        # the same multiset of instance blocks, masks moved with them
        assert sorted(map(tuple, blocks2)) == sorted(map(tuple, blocks))
        nb, nb2 = nxt[i, head:].reshape(m, k), n2[i, head:].reshape(m, k)
        for j in range(m):
            src = next(s for s in range(m) if np.array_equal(nb2[j], nb[s]))
            assert mk2[i, j] == mask[i, src]
        assert mk2[i, m] == mask[i, m]


def test_rates_cycle_through_episodes_and_validation_is_a_geometric_mean(monkeypatch):
    from lbbench.profiles import load_profile
    from lbbench.training.episodes import episode_source

    prof = load_profile("llama2-7b-v100")
    cfg = tr.TrainConfig(profile=prof.name, instances=2, rates="2,20", requests=200)
    assert cfg.rate_list() == [2.0, 20.0]
    src = episode_source(cfg, prof)

    def rate(seed):
        reqs = src(seed)
        return (len(reqs) - 1) / (reqs[-1].arrival_s - reqs[0].arrival_s)

    got = [rate(s) for s in (10, 11, 12, 13)]  # ~2 and ~20 req/s in turn
    assert all(1.5 < r < 2.7 for r in got[0::2]) and all(15 < r < 27 for r in got[1::2]), got
    with pytest.raises(ValueError, match="rates"):
        tr.TrainConfig(rates="2,-1").rate_list()
    assert tr.TrainConfig(rate=7.0).rate_list() == [7.0]

    # validation: geometric mean of each workload's mean E2E
    class _Rec:
        def __init__(self, e2e):
            self.arrival_s, self.finish_s = 0.0, e2e

    runs = iter([[_Rec(1.0), _Rec(3.0)], [_Rec(8.0)]])
    monkeypatch.setattr("lbbench.sim.cluster.ClusterSim.run", lambda self, router: next(runs))
    monkeypatch.setattr("lbbench.routers.rl.policy.WorkloadGuidedRL.__init__", lambda self, *a, **k: None)
    fake = type("P", (), {"save": lambda self, d, meta=None: None, "meta": {}})()
    got = tr.validate(fake, prof, dataclasses_replace(cfg, router="wgrl"), [src(10)[:5], src(11)[:5]])
    assert got == pytest.approx((2.0 * 8.0) ** 0.5)


def dataclasses_replace(cfg, **kw):
    return dataclasses.replace(cfg, **kw)
