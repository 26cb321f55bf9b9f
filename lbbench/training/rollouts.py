"""Rollout collection for RL training: ``collect(policy, episodes) -> transitions``.

One small interface, ``make_collector(cfg, profile, workers, ray_address)``, over
an actor pool of ``lbbench.distributed`` (``get_actor_pool``) whose workers each
hold a ``RolloutWorker`` (an environment over the simulator, the workload source
and the teacher): one in the learner's process, ``N`` local processes, or ``N``
Ray actors (``--ray``). All give the same transitions for the same tasks; a
worker that dies is restarted and its episode replayed once.

The learner stays in the driver. Each round it sends the current network
(numpy weights, ``QPolicy``/``SharedQPolicy``) and a list of ``EpisodeTask``;
a worker replays the task's workload, acting ε-greedily with the network, or
with the teacher (imitation), or with the teacher with probability ``beta``
(DAgger's mixture), optionally labelling every state with the teacher's
action, and returns the episode's ``Transitions`` (numpy arrays). Everything
random in an episode comes from the task (its workload seed, and an
exploration generator seeded by ``(config seed, episode)``), so an episode's
transitions do not depend on which worker ran it or on how many there are:
training with a fixed seed is reproducible for any worker count.

Rewards are the environment's (the guidance weight of the task's
``schedule_episode``); discounting, reward centering and n-step returns are
the learner's business.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from lbbench.distributed.actors import ActorPool, get_actor_pool
from lbbench.training.episodes import episode_source, feature_spec
from lbbench.training.teachers import make_teacher


@dataclass(frozen=True)
class EpisodeTask:
    """One episode to collect."""

    episode: int  #: position in training (seeds exploration)
    seed: int  #: workload seed
    epsilon: float = 0.0  #: exploration rate (when acting with the network)
    act: str = "policy"  #: policy | teacher
    beta: float = 0.0  #: with act=policy: probability of taking the teacher's action instead (DAgger)
    label: bool = False  #: record the teacher's action at every state
    schedule_episode: int = 0  #: the episode index of the reward's guidance schedule


@dataclass
class Transitions:
    """One episode's transitions, in order (arrays of equal length)."""

    task: EpisodeTask
    obs: np.ndarray
    mask: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    next_mask: np.ndarray
    done: np.ndarray
    epochs: np.ndarray
    teacher_action: np.ndarray  #: -1 where the state was not labelled
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.action)


def greedy_action(policy, obs: np.ndarray, mask: np.ndarray) -> int:
    q = policy.q_values(obs)
    return int(np.argmax(np.where(mask, q, -np.inf)))


class RolloutWorker:
    """Holds one environment (and teacher) and plays ``EpisodeTask``s."""

    def __init__(self, cfg, profile):
        from lbbench.training.env import RewardConfig, RouterEnv  # lazy: gymnasium is the optional learn extra

        self.cfg = cfg
        self.teacher = make_teacher(cfg.teacher, profile, max_defer_s=cfg.max_defer_s)
        guidance = None
        if cfg.guidance != "mixing":
            guidance = (self.teacher if cfg.guidance == cfg.teacher
                        else make_teacher(cfg.guidance, profile, max_defer_s=cfg.max_defer_s))
        self.reward_cfg = RewardConfig(cfg.router, r_w=cfg.r_w, gamma=cfg.gamma, beta_d=cfg.beta_d,
                                       guidance_scale=cfg.guidance_scale,
                                       guidance_schedule=cfg.guidance_schedule,
                                       discount=cfg.discount, estimator=cfg.estimator)
        spec = feature_spec(cfg, profile)
        self.env = RouterEnv(profile, cfg.instances, episode_source(cfg, profile), self.reward_cfg,
                             instance_scheduler=cfg.instance_scheduler, chunked_prefill=cfg.chunked_prefill,
                             max_defer_s=cfg.max_defer_s, feature_spec=spec, guidance_fn=guidance,
                             profiles=cfg.fleet_profiles())

    def run(self, policy, task: EpisodeTask) -> Transitions:
        env, cfg = self.env, self.cfg
        if (task.act == "teacher" or task.label or task.beta > 0) and self.teacher is None:
            raise ValueError("rollouts: the task needs a teacher and the configuration has none")
        if task.act == "policy" and policy is None and task.beta < 1.0:
            raise ValueError("rollouts: acting with the network needs a policy")
        rng = np.random.default_rng([cfg.seed, task.episode, 7])
        obs, info = env.reset(seed=task.seed, options={"episode": task.schedule_episode})
        rows: dict[str, list] = {k: [] for k in ("obs", "mask", "action", "reward", "next_obs", "next_mask",
                                                 "done", "epochs", "teacher_action")}
        m = cfg.instances
        total_reward, done = 0.0, False
        while not done:
            mask = info["action_mask"]
            t_act = self.teacher(env.sim) if (task.label or task.act == "teacher" or task.beta > 0) else -1
            if t_act >= 0 and not mask[t_act]:  # the teacher must respect the defer guard
                t_act = int(np.flatnonzero(mask)[0])
            if task.act == "teacher":
                action = t_act
            elif task.beta > 0 and rng.random() < task.beta:
                action = t_act
            elif task.epsilon > 0 and rng.random() < task.epsilon:
                action = int(rng.choice(np.flatnonzero(mask)))
            else:
                action = greedy_action(policy, obs, mask)
            next_obs, reward, terminated, truncated, info = env.step(action)
            total_reward += reward
            nxt, nmask, term = next_obs, info["action_mask"], terminated
            if terminated and cfg.bootstrap_end:  # the stream goes on: bootstrap from where the drain began
                nxt, nmask, term = info["bootstrap_obs"], info["bootstrap_mask"], False
            for k, v in (("obs", obs), ("mask", mask), ("action", action), ("reward", reward),
                         ("next_obs", nxt), ("next_mask", nmask), ("done", float(term)),
                         ("epochs", info["epochs"]), ("teacher_action", t_act if task.label else -1)):
                rows[k].append(v)
            obs, done = next_obs, terminated or truncated
        recs = env.sim.records
        e2e = np.array([r.finish_s - r.arrival_s for r in recs if r.finish_s is not None])
        actions = np.asarray(rows["action"], np.int64)
        stats = {"reward": total_reward, "mean_e2e_s": float(e2e.mean()) if len(e2e) else float("nan"),
                 "p99_e2e_s": float(np.percentile(e2e, 99)) if len(e2e) else float("nan"),
                 "mean_router_wait_s": float(np.mean([r.dispatch_s - r.arrival_s for r in recs])),
                 "preemptions": int(sum(r.num_preemptions or 0 for r in recs)),
                 "decisions": len(actions), "defers": int((actions == m).sum()),
                 "guidance_weight": env.guidance_weight}
        labelled = np.asarray(rows["teacher_action"], np.int64)
        if task.label and len(labelled):
            stats["teacher_agreement"] = float((labelled == actions).mean())
        return Transitions(
            task, np.asarray(rows["obs"], np.float32), np.asarray(rows["mask"], bool), actions,
            np.asarray(rows["reward"], np.float64), np.asarray(rows["next_obs"], np.float32),
            np.asarray(rows["next_mask"], bool), np.asarray(rows["done"], np.float32),
            np.asarray(rows["epochs"], np.float64), labelled, stats)


class Collector(Protocol):
    """``collect(policy, episodes) -> transitions`` (one ``Transitions`` per task, in task order)."""

    workers: int

    def collect(self, policy: Any, episodes: Sequence[EpisodeTask]) -> list[Transitions]: ...

    def close(self) -> None: ...


class PoolCollector:
    """Collects on an actor pool of ``RolloutWorker``s (``lbbench.distributed.get_actor_pool``): each worker
    builds its environment once and plays the tasks it is given; the network goes with every round (Ray puts it
    in the object store once per round)."""

    def __init__(self, pool: ActorPool):
        self.pool = pool
        self.workers = pool.workers

    def collect(self, policy, episodes):
        out: list[Transitions] = [None] * len(episodes)  # type: ignore[list-item]
        labels = [f"episode {t.episode}" for t in episodes]
        for i, transitions in self.pool.submit(episodes, "run", policy, labels=labels):
            out[i] = transitions
        return out

    def close(self) -> None:
        self.pool.close()


def make_collector(cfg, profile, workers: int, ray_address: str | None = None) -> Collector:
    """In-process for ``workers <= 1`` without Ray; ``spawn`` processes for more (no state of the learner, torch
    included, is inherited); Ray actors with ``ray_address``."""
    pool = get_actor_pool(RolloutWorker, (cfg, profile), max(1, workers), ray_address or None)
    return PoolCollector(pool)
