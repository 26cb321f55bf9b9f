"""The paper's formulation pinned against values worked out by hand.

Guidance schedule (heuristic-guided RL, γ = 0.99, β_d = 0.5): λ_k = 1 - e^{-0.5k}
gives λ_1 = 0.393469, λ_4 = 0.864665; the guidance weight (1 - λ_k)·0.99 and the
TD discount λ_k·0.99 below are those numbers multiplied out. Decision epochs:
Δt = 0.02 s, a transition spanning 0.5 s is 25 epochs, 0.99^25 = 0.777821.
"""

from __future__ import annotations

import pytest

from lbbench.core import Request
from lbbench.training.env import RewardConfig, RouterEnv
from lbbench.training.trainer import NStep

from tests_rl_helpers import PROFILE  # noqa: E402


@pytest.mark.parametrize("k,weight,discount", [(0, 0.99, 0.0), (1, 0.600465, 0.389535),
                                               (4, 0.133982, 0.856018)])
def test_fading_guidance_schedule(k, weight, discount):
    cfg = RewardConfig("wgrl", gamma=0.99, beta_d=0.5)  # the default schedule fades
    assert cfg.guidance_weight(k) == pytest.approx(weight, abs=1e-6)
    assert cfg.td_discount(k) == pytest.approx(discount, abs=1e-6)
    assert cfg.guidance_weight(60) < 1e-12 and cfg.td_discount(60) == pytest.approx(0.99)


@pytest.mark.parametrize("k,weight", [(0, 0.0), (1, 0.389535), (4, 0.856018)])
def test_literal_schedule_grows_and_keeps_gamma(k, weight):
    cfg = RewardConfig("wgrl", gamma=0.99, beta_d=0.5, guidance_schedule="literal")
    assert cfg.guidance_weight(k) == pytest.approx(weight, abs=1e-6)
    assert cfg.td_discount(k) == 0.99


def test_other_variants_keep_gamma():
    assert RewardConfig("wa_rl", gamma=0.99).guidance_weight(7) == 0.99
    assert RewardConfig("baseline_rl", gamma=0.99).guidance_weight(0) == 0.0
    for v in ("wa_rl", "baseline_rl"):
        assert RewardConfig(v, gamma=0.99).td_discount(0) == 0.99
    with pytest.raises(ValueError, match="^guidance_schedule"):
        RewardConfig("wgrl", guidance_schedule="nope")
    with pytest.raises(ValueError, match="^discount"):
        RewardConfig("wgrl", discount="nope")


def test_discount_per_epoch_not_per_decision():
    cfg = RewardConfig("wa_rl", gamma=0.99)
    assert cfg.transition_discount(0, 0.0) == 1.0  # a dispatch, next decision at the same instant
    assert cfg.transition_discount(0, 1.0) == pytest.approx(0.99)  # a defer: one Δt
    assert cfg.transition_discount(0, 3.0) == pytest.approx(0.970299)
    assert cfg.transition_discount(0, 25.0) == pytest.approx(0.777821, abs=1e-6)
    per_decision = RewardConfig("wa_rl", gamma=0.99, discount="decision")
    assert per_decision.transition_discount(0, 25.0) == 0.99
    # fading wgrl at episode 1: (0.389535)^2 over two epochs = 0.151737
    assert RewardConfig("wgrl").transition_discount(1, 2.0) == pytest.approx(0.151737, abs=1e-6)


def test_env_reports_epochs_between_decisions():
    def two(seed):  # two requests at 0.5 s, one at 1.0 s
        return [Request(0, 0.5, 50, 20), Request(1, 0.5, 50, 20), Request(2, 1.0, 50, 20)]
    env = RouterEnv(PROFILE, 2, two, RewardConfig("wa_rl"))
    obs, info = env.reset(seed=0)
    assert info["queue_len"] == 2
    _, _, term, _, info = env.step(0)  # next decision at the same instant
    assert info["epochs"] == 0.0 and not term
    _, _, term, _, info = env.step(2)  # defer: one Δt
    assert info["epochs"] == pytest.approx(1.0)
    _, _, term, _, info = env.step(1)  # queue empty: next decision at the arrival at 1.0 s
    assert info["epochs"] == pytest.approx((1.0 - 0.52) / 0.02)
    _, _, term, _, info = env.step(0)  # the last routing decision: the drain follows
    assert term and info["epochs"] == 0.0
    assert info["bootstrap_mask"].tolist() == [False, False, True]


def test_n_step_returns_hand_computed():
    ns = NStep(2)
    assert ns.push("s0", 0, 1.0, 0.5, "s1", None, False) == []
    # (s0): R = 1 + 0.5*2 = 2, Γ = 0.5*0.9 = 0.45, next s2
    out = ns.push("s1", 1, 2.0, 0.9, "s2", None, False)
    assert out == [("s0", 0, 2.0, "s2", None, False, 0.45)]
    # episode end flushes the rest: (s1): R = 2 + 0.9*3 = 4.7, Γ = 0.9*1; (s2): 3, 1
    out = ns.push("s2", 0, 3.0, 1.0, "s3", None, True)
    assert [(o, r, g) for o, _, r, _, _, _, g in out] == [("s1", pytest.approx(4.7), pytest.approx(0.9)),
                                                          ("s2", 3.0, 1.0)]
    assert NStep(1).push("s", 1, 5.0, 0.9, "t", None, False) == [("s", 1, 5.0, "t", None, False, 0.9)]
