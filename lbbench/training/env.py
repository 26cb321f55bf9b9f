"""Gymnasium environment: the router's decision problem over ``ClusterSim``.

A thin adapter over the simulator's step-wise API. One ``step`` is one
decision about the head of the router queue: action ``i < m`` dispatches it to
instance ``i`` through ``ClusterSim.dispatch`` (the same dispatcher code path
as any router), action ``m`` defers it. After a dispatch the next decision is
at the same instant if requests are still queued (the dispatcher keeps asking
until the router defers); after a defer virtual time advances by one decision
epoch ``Δt = profile.min_step_s``.

``ClusterSim.run`` additionally offers the queue to the router when a request
completes; the environment retries a deferred head only after ``Δt``, so a
deferred request may be routed up to one ``Δt`` later in training than in an
evaluation run (tests compare the two on a fixed policy).

**Skipped epochs.** When the queue is empty the only valid action is to defer,
so the environment does not ask: it advances straight to the next arrival
(``skip_empty=True``, the default). The simulated trajectory is identical either
way — ``tests/rl/test_env.py`` replays a fixed policy both ways and compares the
records — only the agent's replay buffer is spared thousands of forced
transitions.

**Reward** (Jain et al., arXiv 2408.13510, Sec. 5; per Δt of virtual time
elapsed by the step):

``r = -Σ_{j∈J} (1/T̂_j)(1 - f_j) · (elapsed/Δt) + r_w · completions - w_k · h``

* ``J``: the queued and the dispatched, unfinished requests; ``T̂_j`` the ideal
  (solo) completion time ``step_time(prompt) + output · Δt``; ``f_j`` the
  fraction of its output generated. The sum is kept incrementally from the
  lifecycle events (``Dispatched``, ``FirstToken``, ``StepsAdvanced``,
  ``Preempted``, ``Finished``), so evaluating it costs O(1), not O(requests);
  it is charged at every point ``k · Δt`` of a global epoch grid that the step
  passes (skipped epochs included), so cutting time into steps differently does
  not change the total.
* ``completions``: requests finished (not failed) during the step (``r_w``).
* ``h``: the guidance gap of the chosen instance, ``max_i r_mix(i) -
  r_mix(chosen)`` with the paper's mixing estimator
  (``lbbench.routers.mixing``; ``estimator="interference"`` for lbbench's
  earlier one), 0 for a defer or when the choice has the least impact,
  times ``guidance_scale`` (1 = the paper's). With ``guidance_fn`` (a
  teacher, ``lbbench.training.teachers``: ``--guidance kv_gate|lookahead``)
  ``h`` is 1 when the action (defer included) differs from the teacher's, else 0.

**Decision epochs and discounting.** The paper's MDP has one epoch per Δt: a
defer costs one Δt, dispatches happen at one instant. ``info["epochs"]`` is the
virtual time from this decision to the next in units of Δt (0 for a dispatch
followed by another decision at the same instant), and
``RewardConfig.transition_discount`` discounts a transition by
``γ_k^epochs`` (``discount="time"``, the default), so the horizon is a span of
simulated time, not a number of decisions; ``discount="decision"`` keeps
``γ_k`` per decision.

**Guidance schedule** (``RewardConfig.guidance_weight`` / ``td_discount``; ``k``
the episode). ``baseline_rl``: ``w_k = 0``, discount ``γ``. ``wa_rl``: ``w_k =
γ``, discount ``γ``. ``wgrl`` with ``guidance_schedule="fading"`` (the default)
follows heuristic-guided RL (Cheng et al. 2021, which the paper builds on):
``λ_k = 1 - exp(-β_d k)`` rises from 0 to 1, the guidance weight ``w_k = (1 -
λ_k) γ`` fades to 0 and the TD discount is ``λ_k γ`` — early episodes learn a
short-horizon problem steered by the heuristic, late ones the original MDP.
``guidance_schedule="literal"`` keeps the schedule as printed, ``γ_k =
exp(-β_d k) γ`` and ``w_k = γ - γ_k``, which *grows* to ``γ`` (so ``wgrl``
turns into ``wa_rl``), with TD discount ``γ``.

``terminated`` once the last request has been routed: the environment then
runs the simulator until every request finishes (so ``sim.records`` is
complete) but reports the reward of that drain in ``info["drain_reward"]``
instead of adding it to the last step's reward — no action can change it, and
one transition carrying minutes of accumulated cost would swamp the learning
signal.

**Mixed fleets** (``profiles=``, one per instance): the simulator runs each
instance on its own profile; ``Δt`` and the ideal completion times ``T̂_j`` are
the fleet's fastest instance's; the mixing guidance keeps ``profile``'s
parameters. ``truncated`` after
``max_steps`` decisions. The valid-action mask is ``info["action_mask"]``; an
invalid action is replaced by defer (or, when deferring is not allowed, the
first valid instance) and flagged ``info["invalid_action"]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from lbbench.core import (Dispatched, Event, Failed, Finished, FirstToken, Preempted, Request,
                          StepsAdvanced)
from lbbench.profiles import Profile
from lbbench.routers.mixing import MixingParams, guidance_gap, heuristic_prior, penalties
from lbbench.routers.rl.features import Featurizer, FeatureSpec, action_mask
from lbbench.sim.cluster import ClusterSim

VARIANTS = ("baseline_rl", "wa_rl", "wgrl")


DISCOUNTS = ("time", "decision")
GUIDANCE_SCHEDULES = ("fading", "literal")


@dataclass(frozen=True)
class RewardConfig:
    """The reward's constants and the guidance schedule (the paper's by default)."""

    variant: str = "wgrl"
    r_w: float = 60.0  #: the paper's r_w: reward per completed request
    gamma: float = 0.99  #: the paper's γ, per decision epoch Δt
    beta_d: float = 0.5  #: the paper's β_d: guidance annealing rate per episode (wgrl)
    guidance_scale: float = 1.0  #: multiplies the guidance gap h (1 = the paper's)
    guidance_schedule: str = "fading"  #: wgrl: fading (heuristic-guided RL) | literal
    discount: str = "time"  #: time: γ per Δt of virtual time | decision: γ per decision
    estimator: str = "paper"  #: mixing estimator behind h: paper | interference

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"router: {self.variant!r} is not an RL variant "
                             f"(choose from {', '.join(VARIANTS)})")
        if self.guidance_schedule not in GUIDANCE_SCHEDULES:
            raise ValueError(f"guidance_schedule: {self.guidance_schedule!r} is not one of "
                             f"{', '.join(GUIDANCE_SCHEDULES)}")
        if self.discount not in DISCOUNTS:
            raise ValueError(f"discount: {self.discount!r} is not one of {', '.join(DISCOUNTS)}")

    def _fading(self) -> bool:
        return self.variant == "wgrl" and self.guidance_schedule == "fading"

    def lambda_k(self, episode: int) -> float:
        """Heuristic-guided RL's mixing rate ``λ_k = 1 - exp(-β_d k)`` (rises to 1)."""
        return 1.0 - math.exp(-self.beta_d * episode)

    def guidance_weight(self, episode: int) -> float:
        """``w_k``: weight of the guidance gap ``h`` at episode ``k``."""
        if self.variant == "baseline_rl":
            return 0.0
        if self.variant == "wa_rl":
            return self.gamma
        if self._fading():
            return (1.0 - self.lambda_k(episode)) * self.gamma
        return self.gamma - math.exp(-self.beta_d * episode) * self.gamma

    def td_discount(self, episode: int) -> float:
        """Discount per epoch (or per decision) at episode ``k``: ``λ_k γ`` for the
        fading schedule, ``γ`` otherwise."""
        return self.lambda_k(episode) * self.gamma if self._fading() else self.gamma

    def transition_discount(self, episode: int, epochs: float) -> float:
        """Discount of one transition spanning ``epochs`` decision epochs."""
        g = self.td_discount(episode)
        if self.discount == "decision":
            return g
        return g ** epochs if g > 0.0 else (1.0 if epochs <= 0 else 0.0)


class _Progress:
    """Router-shaped event observer: keeps ``Σ_j (1/T̂_j)(1 - f_j)`` over the
    dispatched, unfinished requests in O(1) per event (step clocks, as in
    ``ClusterState``)."""

    name = "rl-env"

    def __init__(self, num_instances: int, weight: Callable[[Request], float]):
        self._weight = weight
        self.clock = [0] * num_instances
        self.dec_b = [0.0] * num_instances  # Σ b_j over decoding requests, per instance
        self.sum_a = 0.0  # Σ a_j over dispatched, unfinished
        self.sum_bg = 0.0  # Σ b_j g_j
        self.entries: dict[int, list] = {}  # rid -> [a, b, fixed, base, decoding]

    def route(self, queue, view, now_s):
        return None

    def value(self) -> float:
        return self.sum_a - self.sum_bg

    def on_event(self, ev: Event) -> None:
        if isinstance(ev, StepsAdvanced):
            self.clock[ev.instance] += ev.num_steps
            self.sum_bg += ev.num_steps * self.dec_b[ev.instance]
        elif isinstance(ev, Dispatched):
            r = ev.request
            a = self._weight(r)
            self.entries[r.request_id] = [a, a / max(1, r.output_tokens), 0, 0, False]
            self.sum_a += a
        elif isinstance(ev, FirstToken):
            e = self.entries.get(ev.request_id)
            if e is not None and not e[4]:
                e[2] += 1
                self.sum_bg += e[1]
                e[3] = self.clock[ev.instance]
                e[4] = True
                self.dec_b[ev.instance] += e[1]
        elif isinstance(ev, Preempted):
            e = self.entries.get(ev.request_id)
            if e is not None and e[4]:
                e[2] += self.clock[ev.instance] - e[3]
                e[4] = False
                self.dec_b[ev.instance] -= e[1]
        elif isinstance(ev, (Finished, Failed)):
            e = self.entries.pop(ev.request_id, None)
            if e is not None:
                g = e[2] + (self.clock[ev.instance] - e[3] if e[4] else 0)
                if e[4]:
                    self.dec_b[ev.instance] -= e[1]
                self.sum_a -= e[0]
                self.sum_bg -= e[1] * g


class RouterEnv(gym.Env):
    """One episode = one workload replayed through the simulated cluster."""

    metadata = {"render_modes": []}

    def __init__(self, profile: Profile, num_instances: int,
                 workload: Callable[[int], Sequence[Request]], reward: RewardConfig | None = None, *,
                 instance_scheduler: str = "fcfs", chunked_prefill: bool | None = None,
                 skip_empty: bool = True, max_defer_s: float | None = 30.0,
                 max_steps: int = 2_000_000,
                 feature_spec: FeatureSpec | None = None, prior_scale: float = 0.0,
                 guidance_fn: Callable[[ClusterSim], int] | None = None,
                 profiles: Sequence[Profile] | None = None):
        super().__init__()
        self.profile = profile
        # a mixed fleet: one profile per instance (ClusterSim(profiles=...)); None: num_instances x profile
        self.profiles = list(profiles) if profiles is not None else None
        if self.profiles is not None and len(self.profiles) != num_instances:
            raise ValueError(f"RL environment: {len(self.profiles)} profiles for {num_instances} instances")
        self.num_instances = num_instances
        self.workload = workload
        self.reward_cfg = reward or RewardConfig()
        self.instance_scheduler = instance_scheduler
        self.chunked_prefill = chunked_prefill
        self.skip_empty = skip_empty
        self.max_defer_s = max_defer_s
        self.max_steps = max_steps
        self.prior_scale = prior_scale  # residual-Q prior in info["prior"] (see heuristic_prior)
        # a teacher as the guidance heuristic: h = 1 when the action is not the teacher's (defer included)
        self.guidance_fn = guidance_fn
        # the fleet's fastest instance: the dispatcher's Δt and the ideal (solo) completion times of the reward
        self._fastest = min(self.profiles, key=lambda p: p.min_step_s) if self.profiles else profile
        self.dt_s = self._fastest.min_step_s
        self.feature_spec = feature_spec or (FeatureSpec.from_profiles(self.profiles) if self.profiles
                                             else FeatureSpec.from_profile(profile, num_instances))
        self.featurize = Featurizer(self.feature_spec)
        self.mixing = MixingParams.from_profile(profile)
        self.observation_space = gym.spaces.Box(-2.0, 4.0, shape=(self.feature_spec.obs_dim,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(num_instances + 1)
        self.episode = -1
        self.sim: ClusterSim | None = None

    # ------------------------------------------------------------------ helpers
    def _ideal_s(self, r: Request) -> float:
        return self._fastest.step_time_s(r.prompt_tokens, 0, 0) + r.output_tokens * self.dt_s

    def _weight(self, r: Request) -> float:
        return 1.0 / self._ideal_s(r)

    def _outstanding_term(self) -> float:
        """``Σ_{j∈J} (1/T̂_j)(1 - f_j)`` now (queued requests have f = 0)."""
        n_q = len(self.sim.queue)
        lo = self._num_dispatched
        queued = self._prefix_a[lo + n_q] - self._prefix_a[lo]
        return queued + self._progress.value()

    def _next_arrival_s(self) -> float:
        return self.sim.next_arrival_s

    def _advance(self, until_s: float) -> float:
        """Advance the simulator to ``until_s``; returns the reward accrued.

        The outstanding-work term is charged once per point of the global
        epoch grid ``k * Δt`` passed, evaluated at that point, so the reward of
        a stretch of virtual time does not depend on how it is cut into steps."""
        sim = self.sim
        dt = self.dt_s
        done0 = len(sim.completions_log)
        reward = 0.0
        sim.advance(sim.now_s)  # events exactly at now (e.g. an arrival at 0.0)
        k = math.floor(sim.now_s / dt + 1e-9) + 1
        while not sim.done and k * dt <= until_s + 1e-9:
            sim.advance(k * dt)
            reward -= self._outstanding_term()
            k += 1
        if not sim.done and sim.now_s < until_s:
            sim.advance(until_s)
        return reward + self.reward_cfg.r_w * (len(sim.completions_log) - done0)

    def _to_next_decision(self) -> float:
        """Advance past epochs with nothing to decide; returns the reward accrued.

        With ``skip_empty`` an empty queue jumps straight to the next arrival;
        without it the agent is asked at every Δt (and at each arrival) even
        though deferring is its only valid action. Either way a non-empty queue
        is decided at the same instants, so the trajectory is the same."""
        reward = 0.0
        sim = self.sim
        while not sim.queue and not sim.done:
            nxt = self._next_arrival_s()
            if math.isinf(nxt):  # drain: nothing left to route, no decision will follow
                self._drain_start_s = sim.now_s
                self._drain_obs, self._drain_info = self._obs_info()
                self.drain_reward = self._advance(self._drain_until())
                break
            if not self.skip_empty and self._asked_empty is not None:
                if self._asked_empty:  # the agent already deferred on this empty queue
                    self._asked_empty = False
                    reward += self._advance(max(sim.now_s, min(nxt, self._epoch_s + self.dt_s)))
                    continue
                self._asked_empty = True
                break
            reward += self._advance(max(nxt, sim.now_s))
        return reward

    def _drain_until(self) -> float:
        # far enough for every outstanding request; _advance stops when done
        return self.sim.now_s + 1e7

    def _mask(self) -> np.ndarray:
        return action_mask(self.sim.queue, self.sim.view(), self.sim.now_s, self.max_defer_s)

    def _obs_info(self) -> tuple[np.ndarray, dict[str, Any]]:
        view = self.sim.view()
        obs = self.featurize(self.sim.queue, view)
        mask = action_mask(self.sim.queue, view, self.sim.now_s, self.max_defer_s)
        prior = np.zeros(self.num_instances + 1, np.float32)
        if self.prior_scale > 0 and self.sim.queue:
            pens = penalties(self.mixing, view, self.sim.queue[0], self.reward_cfg.estimator)
            prior[:] = heuristic_prior(pens, mask[:self.num_instances], self.prior_scale)
        return obs, {"action_mask": mask, "now_s": self.sim.now_s, "prior": prior,
                     "queue_len": len(self.sim.queue), "num_completed": self.sim.num_completed}

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        self.episode = int(options.get("episode", self.episode + 1))
        wl_seed = int(seed if seed is not None else self.np_random.integers(2**31))
        requests = list(self.workload(wl_seed))
        if not requests:
            raise ValueError("RL environment: the workload has no requests")
        self.sim = ClusterSim(None if self.profiles else self.profile, self.num_instances, requests,
                              seed=wl_seed, instance_scheduler=self.instance_scheduler,
                              chunked_prefill=self.chunked_prefill, profiles=self.profiles)
        self._progress = _Progress(self.num_instances, self._weight)
        # observe lifecycle events the way a router does (on_event); nothing routes automatically (step-wise)
        self.sim.set_router(self._progress)
        prefix = np.zeros(len(requests) + 1)
        np.cumsum([self._weight(r) for r in self.sim.requests], out=prefix[1:])
        self._prefix_a = prefix
        self._num_dispatched = 0
        self._steps = 0
        self.drain_reward = 0.0
        self._drain_start_s = 0.0
        self._drain_obs, self._drain_info = None, {"action_mask": None}
        self._epoch_s = 0.0
        self._asked_empty = None if self.skip_empty else False
        self.guidance_weight = self.reward_cfg.guidance_weight(self.episode)
        self._to_next_decision()
        return self._obs_info()

    def step(self, action):
        if self.sim is None:
            raise RuntimeError("call reset() before step()")
        sim = self.sim
        m = self.num_instances
        action = int(action)
        mask = self._mask()
        invalid = not (0 <= action <= m and mask[action])
        if invalid:
            action = m if mask[m] else int(np.flatnonzero(mask)[0])
        reward = 0.0
        h = 0.0
        self._epoch_s = sim.now_s
        t0 = sim.now_s
        if self.guidance_fn is not None and sim.queue:
            h = 0.0 if self.guidance_fn(sim) == action else 1.0
            reward -= self.guidance_weight * self.reward_cfg.guidance_scale * h
        if action < m:
            if self.guidance_fn is None:
                view = sim.view()
                pens = penalties(self.mixing, view, sim.queue[0], self.reward_cfg.estimator)
                h = guidance_gap(pens, action, view.healthy_indices())
                reward -= self.guidance_weight * self.reward_cfg.guidance_scale * h
            done0 = len(sim.completions_log)
            sim.dispatch(0, action)
            self._num_dispatched += 1
            reward += self.reward_cfg.r_w * (len(sim.completions_log) - done0)
        elif sim.queue:
            reward += self._advance(sim.now_s + self.dt_s)
        reward += self._to_next_decision()
        self._steps += 1
        terminated = sim.done
        drained = terminated and self._drain_obs is not None
        end_s = self._drain_start_s if drained else sim.now_s
        truncated = not terminated and self._steps >= self.max_steps
        obs, info = self._obs_info()
        info.update(invalid_action=invalid, guidance_gap=h, action=action,
                    epochs=max(0.0, (end_s - t0) / self.dt_s),
                    drain_reward=self.drain_reward if terminated else 0.0)
        if terminated:  # the state the drain started from (to bootstrap from, see bootstrap_end)
            info.update(bootstrap_obs=self._drain_obs if drained else obs,
                        bootstrap_mask=self._drain_info["action_mask"] if drained else info["action_mask"],
                        bootstrap_prior=self._drain_info.get("prior", info["prior"]) if drained else info["prior"])
        return obs, float(reward), terminated, truncated, info
