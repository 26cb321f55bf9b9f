"""The learning recipe: learning curve, parallel rollouts, imitation of a teacher, the gate off."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli.train import train as train_cmd
from lbbench.profiles import load_profile
from lbbench.routers.rl.policy import WorkloadGuidedRL, load_policy
from lbbench.sim.cluster import ClusterSim
from lbbench.training.config import TrainConfig
from lbbench.training.curve import MixingHeuristic
from lbbench.training.episodes import episode_source
from lbbench.training.rollouts import EpisodeTask, make_collector
from lbbench.training.rounds import train
from lbbench.training.teachers import TeacherRouter, kv_gate_action

V100 = "llama2-7b-v100"


def small_cfg(**kw) -> TrainConfig:
    """A few seconds of training on the real V100 profile: 2 instances, 40 requests per episode."""
    base = dict(router="wgrl", profile=V100, instances=2, requests=40, rate=10.0, episodes=2,
                explore_episodes=1, learning_starts=16, batch_size=32, buffer_size=5000, target_every=50,
                val_seeds=1, network="shared", kv_features=True, max_defer_s=30.0, eval_every=1,
                teacher="kv_gate", bc_episodes=1, dagger_rounds=1, imitation_updates=40)
    base.update(kw)
    return TrainConfig(**base)


def test_train_writes_the_learning_curve(tmp_path):
    out = tmp_path / "ckpt"
    res = CliRunner().invoke(train_cmd, [
        "--recipe", "paper", "--router", "wgrl", "--profile", V100, "--instances", "2", "--requests", "40", "--rate", "10",
        "--episodes", "2", "--explore-episodes", "1", "--learning-starts", "16", "--batch-size", "32",
        "--buffer-size", "5000", "--val-seeds", "1", "--eval-every", "1", "--network", "shared",
        "--kv-features", "--teacher", "kv_gate", "--bc-episodes", "1", "--dagger-rounds", "1",
        "--imitation-updates", "20", "--max-defer-s", "30", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "learning curve (validation workloads" in res.output
    lc = pl.read_parquet(out / "learning_curve.parquet")
    assert lc.schema == {"episode": pl.Int64, "policy": pl.Utf8, "mean_e2e_s": pl.Float64,
                         "p99_e2e_s": pl.Float64, "preemptions": pl.Int64}
    # after behaviour cloning (1 episode), each DAgger round (1), and each fine-tuning episode (2)
    assert sorted(set(lc["episode"].to_list())) == [1, 2, 3, 4]
    for _, part in lc.group_by("episode"):
        assert sorted(part["policy"].to_list()) == ["heuristic", "network", "round_robin"]
    assert (lc["p99_e2e_s"] >= lc["mean_e2e_s"]).all() and (lc["mean_e2e_s"] > 0).all()
    # the heuristic and round robin do not learn: one value each along the curve
    for name in ("heuristic", "round_robin"):
        assert lc.filter(pl.col("policy") == name)["mean_e2e_s"].n_unique() == 1
    assert (out / "learning_curve.png").stat().st_size > 1000
    meta = load_policy(out).meta
    assert meta["feature_spec"]["kv_features"] is True
    assert meta["train_config"]["teacher"] == "kv_gate"


def test_train_flag_errors_of_the_recipe(tmp_path):
    runner = CliRunner()
    for args, needle in ((["--recipe", "paper", "--bc-episodes", "2"], "--teacher"),
                         (["--teacher", "none"], "--teacher"), (["--workers", "-1"], "--workers"),
                         (["--eval-every", "0"], "--eval-every"), (["--teacher", "planner"], "--teacher")):
        res = runner.invoke(train_cmd, [*args, "--out", str(tmp_path / "x"), "--quiet"])
        assert res.exit_code == 2, (args, res.output)
        assert needle in res.output


def test_same_seed_and_workers_same_training(tmp_path):
    """Two runs with two rollout processes: identical curves and weights."""
    cfg = small_cfg(workers=2, episodes=2, dagger_rounds=0)
    a = train(cfg, tmp_path / "a", progress=False)
    b = train(cfg, tmp_path / "b", progress=False)
    assert a.drop("wall_s").equals(b.drop("wall_s"))
    assert pl.read_parquet(tmp_path / "a" / "learning_curve.parquet").equals(
        pl.read_parquet(tmp_path / "b" / "learning_curve.parquet"))
    wa, wb = np.load(tmp_path / "a" / "policy.npz"), np.load(tmp_path / "b" / "policy.npz")
    assert set(wa.files) == set(wb.files)
    for k in wa.files:
        np.testing.assert_array_equal(wa[k], wb[k])


def _same(xs, ys) -> None:
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert x.task == y.task and x.stats == y.stats
        for f in ("obs", "mask", "action", "reward", "next_obs", "next_mask", "done", "epochs", "teacher_action"):
            np.testing.assert_array_equal(getattr(x, f), getattr(y, f))


def _tasks():
    return [EpisodeTask(0, 11, act="teacher", label=True), EpisodeTask(1, 12, epsilon=0.5, beta=0.5, label=True),
            EpisodeTask(2, 13, epsilon=0.3)]


def _policy(tmp_path):
    cfg = small_cfg(episodes=1, dagger_rounds=0)
    train(cfg, tmp_path / "p", progress=False)
    return load_policy(tmp_path / "p")


def test_process_pool_rollouts_equal_in_process(tmp_path):
    cfg, prof = small_cfg(), load_profile(V100)
    pol = _policy(tmp_path)
    local = make_collector(cfg, prof, 1).collect(pol, _tasks())
    pool = make_collector(cfg, prof, 2)
    try:
        _same(local, pool.collect(pol, _tasks()))
    finally:
        pool.close()


def test_ray_rollouts_equal_local(tmp_path):
    if os.environ.get("CI"):
        import ray  # in CI the ray extra is installed: a missing one fails here, it does not skip
    else:
        ray = pytest.importorskip("ray")
    cfg, prof = small_cfg(), load_profile(V100)
    pol = _policy(tmp_path)
    local = make_collector(cfg, prof, 1).collect(pol, _tasks())
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False)  # never a cluster already running here
    try:
        actors = make_collector(cfg, prof, 2, "auto")
        try:
            _same(local, actors.collect(pol, _tasks()))
        finally:
            actors.close()
    finally:
        if started:
            ray.shutdown()


def test_behaviour_cloning_reduces_disagreement_with_the_teacher():
    cfg = small_cfg(episodes=0, dagger_rounds=0, bc_episodes=2, imitation_updates=400, val_seeds=0,
                    requests=60)
    curve = train(cfg, None, progress=False)
    bc = curve.filter(pl.col("phase") == "bc")["teacher_disagreement"].to_list()
    # the first point is the untrained network (no update yet), the last after the imitation updates
    assert bc[-1] < 0.65 * bc[0], bc


def test_kv_gate_teacher_defers_when_nothing_fits_and_routes_when_idle():
    prof = load_profile(V100)
    cap = prof.kv_capacity_tokens
    from lbbench.core import ClusterState, Request
    state = ClusterState([prof.instance_spec()] * 2)
    big = Request(0, 0.0, cap // 2, cap // 2 - 10)
    view = state.view(detail=True)
    assert kv_gate_action([big], view, 0.0, max_num_batched_tokens=prof.max_num_batched_tokens) in (0, 1)
    # fill both instances with requests whose true footprint is the whole cache
    from lbbench.core import Dispatched
    for i in range(2):
        state.apply(Dispatched(time_s=0.0, request=Request(10 + i, 0.0, cap // 2, cap // 2), instance=i))
    head = Request(5, 0.0, 64, cap // 2)  # it would still be growing when both residents peak
    view = state.view(detail=True)
    assert kv_gate_action([head], view, 1.0, max_num_batched_tokens=prof.max_num_batched_tokens) == 2
    # the same gate on predicted lengths (deployable) believes the outstanding requests are short
    short = ClusterState([prof.instance_spec()] * 2)
    for i in range(2):
        short.apply(Dispatched(time_s=0.0, request=Request(10 + i, 0.0, cap // 2, cap // 2,
                                                           predicted_output_tokens=8), instance=i))
    sview = short.view(detail=True)
    budget = prof.max_num_batched_tokens
    assert kv_gate_action([head], sview, 1.0, max_num_batched_tokens=budget) == 2
    assert kv_gate_action([head], sview, 1.0, max_num_batched_tokens=budget, oracle=False) in (0, 1)
    # the defer guard: once the head has waited max_defer_s it is routed anyway
    assert kv_gate_action([head], view, 40.0, max_num_batched_tokens=prof.max_num_batched_tokens,
                          max_defer_s=30.0) in (0, 1)


def test_gate_off_routes_with_the_network(tmp_path):
    """A checkpoint the gate marks 'heuristic' routes every decision with the heuristic;
    gate=false routes with the network, which decides differently on some state."""
    cfg = small_cfg(episodes=1, dagger_rounds=0)
    train(cfg, tmp_path / "c", progress=False)
    pol = load_policy(tmp_path / "c")
    pol.save(tmp_path / "gated", meta=dict(pol.meta, gate="heuristic"))
    prof = load_profile(V100)
    reqs = episode_source(dataclasses.replace(cfg, requests=80), prof)(5)
    gated = WorkloadGuidedRL(2, checkpoint=tmp_path / "gated")
    rec_gated = ClusterSim(prof, 2, reqs, seed=5).run(gated)
    assert gated.num_fallbacks == gated.num_decisions > 0
    net = WorkloadGuidedRL(2, checkpoint=tmp_path / "gated", gate=False, ood_guard=False)
    rec_net = ClusterSim(prof, 2, reqs, seed=5).run(net)
    assert net.num_fallbacks == 0 and net.num_decisions > 0
    heur = ClusterSim(prof, 2, reqs, seed=5).run(MixingHeuristic(gated.mixing, gated.estimator))
    key = lambda recs: [(r.request_id, r.instance, r.dispatch_s) for r in sorted(recs, key=lambda r: r.request_id)]
    assert key(rec_gated) == key(heur)  # the gated router is the heuristic
    assert key(rec_net) != key(heur)  # the network is not


def test_teacher_router_beats_round_robin_with_exact_lengths():
    """The kv_gate teacher, as a router, on an overloaded 2-instance V100 workload (hand-checkable
    direction: it trades router wait for far fewer preemptions)."""
    from lbbench.routers.registry import get_router
    prof = load_profile(V100)
    reqs = episode_source(small_cfg(requests=300, rate=8.0, predictor="oracle"), prof)(3)
    rr = ClusterSim(prof, 2, reqs, seed=3).run(get_router("round_robin", num_instances=2, profile=prof))
    gate = ClusterSim(prof, 2, reqs, seed=3).run(TeacherRouter(2, prof, 120.0))
    assert sum(r.num_preemptions or 0 for r in gate) < sum(r.num_preemptions or 0 for r in rr)


def test_interrupted_training_keeps_what_it_had(tmp_path, monkeypatch):
    """Ctrl-C during fine-tuning: the checkpoint and the learning curve so far are written, marked incomplete."""
    from lbbench.training import rounds

    real = rounds.make_collector

    class Interrupting:
        def __init__(self, *a, **kw):
            self.inner, self.calls, self.workers = real(*a, **kw), 0, 1

        def collect(self, policy, tasks):
            self.calls += 1
            if self.calls == 4:  # bc, dagger, one fine-tuning round, then Ctrl-C
                raise KeyboardInterrupt
            return self.inner.collect(policy, tasks)

        def close(self):
            self.inner.close()

    monkeypatch.setattr(rounds, "make_collector", Interrupting)
    with pytest.raises(KeyboardInterrupt):
        train(small_cfg(episodes=3), tmp_path, progress=False)
    assert load_policy(tmp_path).meta.get("incomplete") is True
    assert pl.read_parquet(tmp_path / "learning_curve.parquet")["episode"].max() == 3
