"""Training in rounds over parallel rollouts: imitation warm start, then Double DQN.

``train_rounds(config)`` is the loop ``train`` hands over to with ``--workers
N`` or ``--teacher``. It reads top to bottom, in three phases, all collecting
through one ``Collector`` (``rollouts``: in process, a process pool, or Ray
actors); the learner (torch) stays here and sends the workers its network as
numpy weights each round:

1. **Behaviour cloning** (``bc_episodes``): the teacher acts; every state is
   stored with the teacher's action in a demonstration buffer, and every
   transition in the replay buffer. The network is then fitted for
   ``imitation_updates`` steps on the Double-DQN loss plus the large-margin
   imitation loss of DQfD (Hester et al. 2018):
   ``max_a [Q(s, a) + margin · 1(a ≠ a_T)] − Q(s, a_T)`` over the valid actions,
   which keeps the values Q-values (so fine-tuning can start from them) while
   ranking the teacher's action first.
2. **DAgger** (``dagger_rounds``, Ross et al. 2011): each round the learner acts
   (the teacher with probability ``0.5^round``) on ``max(1, workers)``
   episodes, the teacher labels every state it visits, the labels join the
   demonstration buffer, and the network is refitted.
3. **Double-DQN fine-tuning** (``episodes``): ε-greedy episodes (ε from
   ``epsilon_start`` to ``epsilon_end`` over ``explore_episodes``), then the
   ``decisions / train_every`` updates they pay for, the imitation loss kept
   on the demonstrations with weight ``demo_weight``. The reward is the
   paper's, with its guidance schedule counted in fine-tuning episodes.

The observation is always the deployable one (predicted lengths, no future
arrivals); only the teacher reads more. Every ``eval_every`` episodes (all
phases counted) the network is scored on the validation workloads for the
learning curve (``curve``), and the best of those points is exported, then
gated against the heuristic on fresh validation workloads as in ``trainer``.
Everything random comes from the config seed and the episode index, so a
fixed seed and worker count give the same networks. Interrupted (Ctrl-C), it
still writes what it had, the checkpoint's metadata marked ``incomplete``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch import nn

from lbbench.profiles import Profile, load_profile
from lbbench.routers.rl.features import FeatureSpec
from lbbench.training.config import TrainConfig
from lbbench.training.curve import LearningCurve
from lbbench.training.env import RewardConfig
from lbbench.training.episodes import episode_source
from lbbench.training.rollouts import EpisodeTask, Transitions, make_collector
from lbbench.training.trainer import (NStep, ReplayBuffer, checkpoint_meta, epsilon_at, export_policy,
                                      make_network, save_checkpoint)


class DemoBuffer:
    """States labelled with the teacher's action (DAgger's aggregate)."""

    def __init__(self, capacity: int, obs_dim: int, num_actions: int):
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.mask = np.zeros((capacity, num_actions), bool)
        self.action = np.zeros(capacity, np.int64)
        self.capacity, self.size, self.pos = capacity, 0, 0

    def add(self, obs: np.ndarray, mask: np.ndarray, action: np.ndarray) -> None:
        for o, m, a in zip(obs, mask, action):
            i = self.pos
            self.obs[i], self.mask[i], self.action[i] = o, m, a
            self.pos = (i + 1) % self.capacity
            self.size = min(self.size + 1, self.capacity)

    def sample(self, rng: np.random.Generator, n: int):
        idx = rng.integers(0, self.size, size=n)
        return torch.from_numpy(self.obs[idx]), torch.from_numpy(self.mask[idx]), torch.from_numpy(self.action[idx])


def margin_loss(q: torch.Tensor, mask: torch.Tensor, teacher: torch.Tensor, margin: float) -> torch.Tensor:
    """DQfD's large-margin loss over the valid actions."""
    bonus = torch.full_like(q, margin)
    bonus.scatter_(1, teacher.unsqueeze(1), 0.0)
    best = (q + bonus).masked_fill(~mask, -torch.inf).max(dim=1).values
    return (best - q.gather(1, teacher.unsqueeze(1)).squeeze(1)).mean()


def disagreement(policy, obs: np.ndarray, mask: np.ndarray, teacher: np.ndarray) -> float:
    """Share of labelled states where the greedy network's action is not the teacher's."""
    if not len(teacher):
        return float("nan")
    q = np.stack([policy.q_values(o) for o in obs])
    return float((np.argmax(np.where(mask, q, -np.inf), axis=1) != teacher).mean())


def train_rounds(cfg: TrainConfig, out_dir: str | Path | None = None, *, progress: bool = True,
                 profile: Profile | None = None, ray_address: str | None = None) -> pl.DataFrame:
    """Train one variant in rounds (see the module docstring); returns the training curve."""
    if cfg.prior_scale > 0 or cfg.permute_instances:
        raise ValueError("workers: the round-based loop supports neither prior_scale nor permute_instances")
    if (cfg.bc_episodes or cfg.dagger_rounds) and cfg.teacher == "none":
        raise ValueError("teacher: behaviour cloning and DAgger need a teacher (kv_gate or lookahead)")
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    prof = profile or load_profile(cfg.profile)
    spec = FeatureSpec.from_profile(prof, cfg.instances, kv_features=cfg.kv_features)
    obs_dim, n_act = spec.obs_dim, cfg.instances + 1
    reward_cfg = RewardConfig(cfg.router, r_w=cfg.r_w, gamma=cfg.gamma, beta_d=cfg.beta_d,
                              guidance_scale=cfg.guidance_scale, guidance_schedule=cfg.guidance_schedule,
                              discount=cfg.discount, estimator=cfg.estimator)
    q, q_target = make_network(cfg, spec), make_network(cfg, spec)
    q_target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=cfg.lr)
    buf = ReplayBuffer(cfg.buffer_size, obs_dim, n_act)
    demo = DemoBuffer(cfg.buffer_size, obs_dim, n_act)
    meta = checkpoint_meta(cfg, prof, spec)
    episodes = episode_source(cfg, prof)
    val_seeds = [cfg.train_seed_base - 1 - k for k in range(cfg.val_seeds)]
    lc = LearningCurve(cfg, prof, [episodes(s) for s in val_seeds], val_seeds, out_dir) if cfg.val_seeds else None
    collector = make_collector(cfg, prof, cfg.workers, ray_address)
    per_round = max(1, cfg.workers)
    state = {"updates": 0, "sum_reward": 0.0, "sum_epochs": 0.0, "done": 0, "next_eval": cfg.eval_every}
    rows: list[dict] = []
    best: tuple[float, object] | None = None
    t_start = time.perf_counter()

    def export(episode: int):
        return export_policy(q, dict(meta, episode=episode))

    def store(tr: Transitions, rl_episode: int) -> None:
        nstep = NStep(cfg.n_step)
        for i in range(len(tr)):
            reward, epochs = float(tr.reward[i]), float(tr.epochs[i])
            state["sum_reward"] += reward
            state["sum_epochs"] += epochs
            if cfg.reward_centering and state["sum_epochs"] > 0:
                reward -= state["sum_reward"] / state["sum_epochs"] * epochs
            disc = reward_cfg.transition_discount(rl_episode, epochs)
            done = bool(tr.done[i])
            for t in nstep.push(tr.obs[i], tr.action[i], reward * cfg.reward_scale, disc, tr.next_obs[i],
                                tr.next_mask[i], done):
                buf.add(*t)
        for t in nstep.flush(tr.next_obs[-1], tr.next_mask[-1], False) if len(tr) else []:
            buf.add(*t)
        labelled = tr.teacher_action >= 0
        if labelled.any():
            demo.add(tr.obs[labelled], tr.mask[labelled], tr.teacher_action[labelled])

    def fit(n_updates: int, demo_weight: float) -> tuple[float, float]:
        losses, qs = [], []
        sync = max(1, cfg.target_every // max(1, cfg.train_every))
        for _ in range(n_updates):
            if buf.size < max(1, cfg.learning_starts):
                break
            b_obs, b_act, b_rew, b_next, b_mask, b_done, b_disc = buf.sample(rng, cfg.batch_size)
            with torch.no_grad():
                best_next = q(b_next).masked_fill(~b_mask, -torch.inf).argmax(dim=1, keepdim=True)
                target = b_rew + b_disc * q_target(b_next).gather(1, best_next).squeeze(1) * (1.0 - b_done)
            q_taken = q(b_obs).gather(1, b_act.unsqueeze(1)).squeeze(1)
            loss = nn.functional.smooth_l1_loss(q_taken, target)
            if demo_weight > 0 and demo.size:
                d_obs, d_mask, d_act = demo.sample(rng, cfg.batch_size)
                loss = loss + demo_weight * margin_loss(q(d_obs), d_mask, d_act, cfg.margin)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(q.parameters(), 10.0)
            opt.step()
            state["updates"] += 1
            if state["updates"] % sync == 0:
                q_target.load_state_dict(q.state_dict())
            losses.append(float(loss.detach()))
            qs.append(float(q_taken.detach().mean()))
        return (float(np.mean(losses)) if losses else float("nan"), float(np.mean(qs)) if qs else float("nan"))

    def round_(phase: str, tasks: list[EpisodeTask], rl_episode: int, n_updates: int | None,
               demo_weight: float) -> None:
        trs = collector.collect(export(state["done"]) if state["done"] or phase != "bc" else None, tasks)
        for tr in trs:
            store(tr, tr.task.schedule_episode)
        decisions = sum(len(tr) for tr in trs)
        if n_updates is None:
            n_updates = decisions // max(1, cfg.train_every)
        loss, q_mean = fit(n_updates, demo_weight)
        state["done"] += len(tasks)
        pol = export(state["done"])
        dis = float("nan")
        if demo.size:
            k = rng.integers(0, demo.size, size=min(demo.size, 2000))
            dis = disagreement(pol, demo.obs[k], demo.mask[k], demo.action[k])
        for tr in trs:
            rows.append({"episode": tr.task.episode, "phase": phase, "teacher_agreement": float("nan"),
                         **tr.stats, "epsilon": tr.task.epsilon,
                         "beta": tr.task.beta, "loss": loss, "q_mean": q_mean, "teacher_disagreement": dis,
                         "updates": state["updates"], "wall_s": time.perf_counter() - t_start,
                         "val_e2e_s": float("nan")})
        if phase != "bc" and (state["done"] >= state["next_eval"] or phase == "dagger" or state["done"] == total):
            record(pol)
        if progress:
            r = rows[-1]
            print(f"[{phase}] episodes {state['done']}/{total}  e2e {r['mean_e2e_s']:.1f}s  "
                  f"val {r.get('val_e2e_s', float('nan')):.1f}s  disagree {dis:.3f}  "
                  f"{time.perf_counter() - t_start:.0f}s", flush=True)

    def record(pol) -> None:
        nonlocal best
        if lc is None:
            return
        net = lc.record(state["done"], pol)
        state["next_eval"] = state["done"] + max(1, cfg.eval_every)
        rows[-1]["val_e2e_s"] = net["mean_e2e_s"]
        if best is None or net["mean_e2e_s"] < best[0]:
            best = (net["mean_e2e_s"], pol)

    def seed_of(k: int) -> int:
        return cfg.train_seed_base + 1000 * cfg.seed + k

    total = cfg.bc_episodes + cfg.dagger_rounds * per_round + cfg.episodes
    k = 0
    try:
        for start in range(0, cfg.bc_episodes, per_round):  # 1. behaviour cloning
            n = min(per_round, cfg.bc_episodes - start)
            round_("bc", [EpisodeTask(k + j, seed_of(k + j), act="teacher", label=True) for j in range(n)],
                   0, 0, 1.0)
            k += n
        if cfg.bc_episodes:
            rows[-1]["loss"], rows[-1]["q_mean"] = fit(cfg.imitation_updates, 1.0)
            pol = export(state["done"])
            rows[-1]["teacher_disagreement"] = disagreement(pol, demo.obs[:demo.size], demo.mask[:demo.size],
                                                            demo.action[:demo.size])
            record(pol)
        for r in range(cfg.dagger_rounds):  # 2. DAgger
            beta = 0.5 ** (r + 1)
            round_("dagger", [EpisodeTask(k + j, seed_of(k + j), beta=beta, label=True)
                              for j in range(per_round)], 0, cfg.imitation_updates, 1.0)
            k += per_round
        rl = 0
        while rl < cfg.episodes:  # 3. Double-DQN fine-tuning
            n = min(per_round, cfg.episodes - rl)
            tasks = [EpisodeTask(k + j, seed_of(k + j), epsilon=epsilon_at(cfg, rl + j), schedule_episode=rl + j)
                     for j in range(n)]
            round_("rl", tasks, rl, None, cfg.demo_weight if demo.size else 0.0)
            k += n
            rl += n
    except KeyboardInterrupt:  # keep what was learned, marked incomplete
        interrupted = True
    else:
        interrupted = False
    finally:
        collector.close()
    curve = pl.DataFrame(rows, infer_schema_length=None)
    if out_dir is not None and buf.size:
        low, high = buf.state_range()
        last = export(state["done"])
        if interrupted:
            last.meta["incomplete"] = True
            if best is not None:
                best[1].meta["incomplete"] = True
        save_checkpoint(cfg, prof, out_dir, best, last, (low, high), episodes, curve,
                        lc.frame() if lc is not None else None)
    if interrupted:
        raise KeyboardInterrupt
    return curve
