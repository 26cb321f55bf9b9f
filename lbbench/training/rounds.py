"""The training loop of the RL routers: imitation warm start, then Double DQN, in rounds.

``train(config)`` reads top to bottom. It plans the run as rounds of
``max(1, workers)`` episodes, each collected through one ``Collector``
(``rollouts``: one worker in this process, a process pool, or Ray actors)
with the current network, sent to the workers as numpy weights; the learner
(``trainer.Learner``, torch) stays here. Three phases:

1. **Behaviour cloning** (``bc_episodes``): the teacher acts; every state is
   stored with the teacher's action in the demonstrations, and every
   transition in the replay buffer. The network is then fitted for
   ``imitation_updates`` steps on the Double-DQN loss plus the large-margin
   imitation loss of DQfD (``trainer.margin_loss``), which keeps the values
   Q-values (so fine-tuning can start from them) while ranking the teacher's
   action first.
2. **DAgger** (``dagger_rounds``, Ross et al. 2011): in round ``r`` (from 1)
   the learner acts (the teacher with probability ``dagger_beta_decay^r``),
   the teacher labels every state it visits, the labels join the
   demonstrations, and the network is refitted for ``imitation_updates`` steps.
3. **Double-DQN fine-tuning** (``episodes``): ε-greedy episodes (ε from
   ``epsilon_start`` to ``epsilon_end`` over ``explore_episodes``), then the
   ``decisions / train_every`` updates they pay for, the imitation loss kept
   on the demonstrations with weight ``demo_weight``. The reward is the
   paper's, with its guidance schedule counted in fine-tuning episodes.

Without a teacher only phase 3 runs: with ``workers`` 0 or 1 that is the
serial case, an episode then its updates. The observation is always the
deployable one (predicted lengths, no future arrivals); only the teacher reads
more. Training workload ``k`` (all phases counted) has seed
``TrainConfig.workload_seed(k)``, disjoint from the evaluation seeds
``0..N`` of ``lbbench run --seeds N``.

The learning curve (``curve``) scores the greedy network on ``val_seeds``
validation workloads after behaviour cloning, after every DAgger round, every
``eval_every`` episodes (at most every half run) and at the end; the best of
those points is exported, then gated against the heuristic on fresh
validation workloads (``trainer.save_checkpoint``). Each episode is a row of
the training curve (``curve.parquet``). Everything random comes from the
config seed and the episode index, so a fixed seed and worker count give the
same networks. Interrupted (Ctrl-C), it still writes what it had, the
checkpoint's metadata marked ``incomplete``. With ``fleet`` (a mixed fleet)
every episode and validation runs on the fleet (``episodes.make_sim``).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from lbbench.profiles import Profile, load_profile
from lbbench.training.config import TrainConfig
from lbbench.training.curve import LearningCurve
from lbbench.training.env import RewardConfig
from lbbench.training.episodes import episode_source, feature_spec
from lbbench.training.rollouts import EpisodeTask, make_collector
from lbbench.training.trainer import Learner, checkpoint_meta, epsilon_at, export_policy, save_checkpoint


def plan_rounds(cfg: TrainConfig) -> list[tuple[str, list[EpisodeTask]]]:
    """The run as ``(phase, episodes)`` rounds: behaviour cloning, DAgger, fine-tuning."""
    per_round = max(1, cfg.workers)
    rounds: list[tuple[str, list[EpisodeTask]]] = []
    k = 0
    for start in range(0, cfg.bc_episodes, per_round):
        n = min(per_round, cfg.bc_episodes - start)
        rounds.append(("bc", [EpisodeTask(k + j, cfg.workload_seed(k + j), act="teacher", label=True)
                              for j in range(n)]))
        k += n
    for r in range(cfg.dagger_rounds):
        beta = cfg.dagger_beta_decay ** (r + 1)
        rounds.append(("dagger", [EpisodeTask(k + j, cfg.workload_seed(k + j), beta=beta, label=True)
                                  for j in range(per_round)]))
        k += per_round
    for rl in range(0, cfg.episodes, per_round):
        n = min(per_round, cfg.episodes - rl)
        rounds.append(("rl", [EpisodeTask(k + j, cfg.workload_seed(k + j), epsilon=epsilon_at(cfg, rl + j),
                                          schedule_episode=rl + j) for j in range(n)]))
        k += n
    return rounds


def train(cfg: TrainConfig, out_dir: str | Path | None = None, *, progress: bool = True,
          profile: Profile | None = None, ray_address: str | None = None) -> pl.DataFrame:
    """Train one variant (see the module docstring); writes the checkpoint to ``out_dir``
    (when given) and returns the training curve. ``ray_address`` puts the rollout workers on Ray."""
    if (cfg.bc_episodes or cfg.dagger_rounds) and cfg.teacher == "none":
        raise ValueError("teacher: behaviour cloning and DAgger need a teacher (kv_gate or lookahead)")
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    if cfg.fleet:  # a mixed fleet: its first profile stands for the run (workload, mixing parameters, name)
        cfg = cfg.for_fleet()
        prof = cfg.fleet_profiles()[0]
    else:
        prof = profile or load_profile(cfg.profile)
    spec = feature_spec(cfg, prof)
    reward_cfg = RewardConfig(cfg.router, r_w=cfg.r_w, gamma=cfg.gamma, beta_d=cfg.beta_d,
                              guidance_scale=cfg.guidance_scale, guidance_schedule=cfg.guidance_schedule,
                              discount=cfg.discount, estimator=cfg.estimator)
    learner = Learner(cfg, spec, reward_cfg, rng)
    meta = checkpoint_meta(cfg, prof, spec)
    episodes = episode_source(cfg, prof)
    val_seeds = cfg.validation_seeds(cfg.val_seeds)
    lc = LearningCurve(cfg, prof, [episodes(s) for s in val_seeds], val_seeds, out_dir) if cfg.val_seeds else None
    rounds = plan_rounds(cfg)
    total = sum(len(tasks) for _, tasks in rounds)
    every = min(max(1, cfg.eval_every), max(1, total // 2))  # a run of 4 or more episodes: evaluated twice
    next_eval = every
    done = 0  # episodes collected so far
    rows: list[dict] = []
    best: tuple[float, object] | None = None
    t_start = time.perf_counter()
    collector = make_collector(cfg, prof, cfg.workers, ray_address)
    try:
        for i, (phase, tasks) in enumerate(rounds):
            policy = export_policy(learner.q, dict(meta, episode=done)) if done or phase != "bc" else None
            trs = collector.collect(policy, tasks)
            for tr in trs:
                learner.store(tr)
            if phase == "rl":
                loss, q_mean = learner.fit(sum(len(tr) for tr in trs) // max(1, cfg.train_every),
                                           cfg.demo_weight if learner.demo.size else 0.0)
            else:
                loss, q_mean = learner.fit(cfg.imitation_updates if phase == "dagger" else 0, 1.0)
            done += len(tasks)
            pol = export_policy(learner.q, dict(meta, episode=done))
            dis = learner.disagreement(pol)
            for tr in trs:
                rows.append({"episode": tr.task.episode, "phase": phase, "teacher_agreement": float("nan"),
                             **tr.stats, "epsilon": tr.task.epsilon, "beta": tr.task.beta, "loss": loss,
                             "q_mean": q_mean, "teacher_disagreement": dis, "updates": learner.updates,
                             "wall_s": time.perf_counter() - t_start, "val_e2e_s": float("nan")})
            bc_end = phase == "bc" and (i + 1 == len(rounds) or rounds[i + 1][0] != "bc")
            if bc_end:  # fit the demonstrations of every behaviour-cloning episode
                rows[-1]["loss"], rows[-1]["q_mean"] = learner.fit(cfg.imitation_updates, 1.0)
                pol = export_policy(learner.q, dict(meta, episode=done))
                rows[-1]["teacher_disagreement"] = learner.disagreement(pol, sample=False)
            evaluate = bc_end or (phase != "bc" and (done >= next_eval or phase == "dagger" or done == total))
            if evaluate and lc is not None:
                net = lc.record(done, pol)
                next_eval = done + every
                rows[-1]["val_e2e_s"] = net["mean_e2e_s"]
                if best is None or net["mean_e2e_s"] < best[0]:
                    best = (net["mean_e2e_s"], pol)
            if progress:
                r = rows[-1]
                print(f"[{phase}] episodes {done}/{total}  e2e {r['mean_e2e_s']:.1f}s  "
                      f"val {r['val_e2e_s']:.1f}s  disagree {r['teacher_disagreement']:.3f}  "
                      f"{time.perf_counter() - t_start:.0f}s", flush=True)
    except KeyboardInterrupt:  # keep what was learned, marked incomplete
        interrupted = True
    else:
        interrupted = False
    finally:
        collector.close()
    curve = pl.DataFrame(rows, infer_schema_length=None)
    if out_dir is not None and learner.buf.size:
        last = export_policy(learner.q, dict(meta, episode=done))
        if interrupted:
            last.meta["incomplete"] = True
            if best is not None:
                best[1].meta["incomplete"] = True
        save_checkpoint(cfg, prof, out_dir, best, last, learner.buf.state_range(), episodes, curve,
                        lc.frame() if lc is not None else None)
    if interrupted:
        raise KeyboardInterrupt
    return curve
