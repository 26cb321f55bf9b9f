"""The Gymnasium environment: API conformance, reward terms, skipped epochs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from lbbench.core import Request
from lbbench.training.env import RewardConfig, RouterEnv

from tests_rl_helpers import PROFILE, small_workload as workload  # noqa: E402


def make_env(variant="wgrl", **kw) -> RouterEnv:
    return RouterEnv(PROFILE, 3, workload, RewardConfig(variant), **kw)


def rollout(env: RouterEnv, seed: int, policy) -> tuple[list[float], list]:
    obs, info = env.reset(seed=seed)
    rewards, done = [], False
    while not done:
        obs, r, term, trunc, info = env.step(policy(obs, info))
        rewards.append(r)
        done = term or trunc
    return rewards, env.sim.records


def round_robin_with_defers():
    state = {"i": 0}

    def pol(obs, info):
        state["i"] += 1
        if state["i"] % 5 == 0:
            return 3  # defer now and then
        return state["i"] % 3
    return pol


def test_check_env_passes():
    check_env(make_env(), skip_render_check=True)


def test_episode_routes_every_request_once_and_terminates():
    env = make_env()
    _, recs = rollout(env, 7, round_robin_with_defers())
    assert sorted(r.request_id for r in recs) == list(range(40))
    assert all(r.finish_s is not None and r.dispatch_s >= r.arrival_s for r in recs)


def test_same_seed_same_trajectory():
    a = rollout(make_env(), 3, round_robin_with_defers())
    b = rollout(make_env(), 3, round_robin_with_defers())
    assert a[0] == b[0]
    assert [r.as_dict() for r in a[1]] == [r.as_dict() for r in b[1]]


def test_skipping_empty_epochs_changes_no_result():
    """With an empty queue the only valid action is defer; skipping those epochs
    must leave the simulated trajectory (every record) and the total reward
    unchanged."""
    def pol(obs, info):
        mask = info["action_mask"]
        return int(np.flatnonzero(mask)[0]) if mask[:3].any() else 3
    ra, a = rollout(make_env(skip_empty=True), 11, pol)
    rb, b = rollout(make_env(skip_empty=False), 11, pol)
    assert len(rb) > len(ra)  # the unskipped env asked about empty epochs too
    assert [r.as_dict() for r in a] == [r.as_dict() for r in b]
    assert sum(ra) == pytest.approx(sum(rb), rel=1e-6)


def test_reward_terms():
    def one(seed):
        return [Request(0, 0.5, 100, 50)]
    env = RouterEnv(PROFILE, 3, one, RewardConfig("baseline_rl", r_w=60.0))
    obs, info = env.reset(seed=1)
    assert info["queue_len"] == 1 and info["now_s"] == 0.5
    t_hat = PROFILE.step_time_s(100, 0, 0) + 50 * 0.02
    # a defer with one queued request and an idle cluster costs exactly its
    # 1/T_hat weight for the epoch
    obs, r, term, trunc, info = env.step(3)
    assert r == pytest.approx(-1.0 / t_hat) and info["now_s"] == pytest.approx(0.52)
    # routing it ends the episode; the drain (50 tokens, one completion) is
    # reported apart: -sum of (1/T_hat)(1 - f) over the drain epochs + r_w
    obs, r, term, trunc, info = env.step(1)
    assert term and r == 0.0
    # the drain charges the epoch points 0.54, 0.56, ..., 1.02 s (25 of them; the request finishes at 1.0355 s)
    # (1/T_hat)(1 - f) each, with f = 1/50: its first token is counted, and the decode steps of the unchanged
    # batch are reported when the batch changes, at its finish; then r_w = 60 for the one completion:
    # 60 - 25 x 0.98 / 1.02 = 35.980392...
    assert info["drain_reward"] == pytest.approx(60.0 - 25 * (1 - 1 / 50) / t_hat, rel=1e-12)
    assert info["drain_reward"] == pytest.approx(35.980392, abs=1e-6)
    assert env.sim.records[0].instance == 1


def test_guidance_weights_and_gap_penalty():
    assert RewardConfig("baseline_rl").guidance_weight(5) == 0.0
    assert RewardConfig("wa_rl", gamma=0.9).guidance_weight(0) == 0.9
    wg = RewardConfig("wgrl", gamma=0.9, beta_d=0.5)  # fading: (1 - λ_k) γ
    assert wg.guidance_weight(0) == 0.9
    assert wg.guidance_weight(2) == pytest.approx(math.exp(-1.0) * 0.9)
    lit = RewardConfig("wgrl", gamma=0.9, beta_d=0.5, guidance_schedule="literal")
    assert lit.guidance_weight(0) == 0.0
    assert lit.guidance_weight(2) == pytest.approx(0.9 - math.exp(-1.0) * 0.9)
    with pytest.raises(ValueError, match="not an RL variant"):
        RewardConfig("jsq")
    # piling everything on instance 0 draws mixing penalties under wa_rl only
    gaps = {}
    for variant in ("wa_rl", "baseline_rl"):
        env = make_env(variant)
        obs, info = env.reset(seed=2)
        total_h, done = 0.0, False
        while not done:
            obs, r, term, trunc, info = env.step(0 if info["action_mask"][0] else 3)
            total_h += info["guidance_gap"]
            done = term or trunc
        gaps[variant] = total_h
    assert gaps["wa_rl"] > 0 and gaps["wa_rl"] == pytest.approx(gaps["baseline_rl"])  # h is reported always


def test_invalid_action_is_replaced_and_flagged():
    env = make_env()
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step(99)
    assert info["invalid_action"] and info["action"] == 3


def test_env_and_batch_simulator_agree_without_defers():
    """A policy that never defers gives the same records in the environment and
    in ClusterSim.run (the same dispatcher path, the same instants)."""
    from lbbench.core import Decision
    from lbbench.sim.cluster import ClusterSim

    class RR:
        name = "rr"

        def __init__(self):
            self.i = 0

        def route(self, queue, view, now_s):
            self.i += 1
            return Decision(0, self.i % 3)

    counter = {"i": 0}

    def pol(obs, info):
        if not info["action_mask"][:3].any():
            return 3
        counter["i"] += 1
        return counter["i"] % 3

    _, env_recs = rollout(make_env(), 4, pol)
    run_recs = ClusterSim(PROFILE, 3, workload(4), seed=4).run(RR())
    key = lambda r: (r.request_id, r.instance, r.dispatch_s, r.first_token_s, r.finish_s)  # noqa: E731
    assert sorted(map(key, env_recs)) == sorted(map(key, run_recs))
