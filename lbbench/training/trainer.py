"""Double-DQN training for the RL routers (torch; CleanRL-style, one function).

``train(config)`` reads top to bottom: build the environment, the online and
target Q-networks and the replay buffer; for each episode replay a fresh
workload, act ε-greedily over the *valid* actions, store transitions, and every
``train_every`` decisions fit the online network on a batch of ``batch_size``
against the Double-DQN target ``R + Γ · Q_target(s', argmax_a Q_online(s', a))``
(the argmax restricted to the next state's valid actions). ``Γ`` is the
transition's discount from ``RewardConfig.transition_discount`` — ``γ_k`` per
decision epoch Δt of virtual time it spans (see ``env``) — and with ``n_step >
1`` ``R``/``Γ`` are the discounted sum and product over ``n`` transitions.
With ``bootstrap_end`` the last routing decision of an episode is not
terminal: its target bootstraps from the state the drain starts in. With
``reward_centering`` each stored reward is ``r - r̄ · epochs``, ``r̄`` the mean
reward per decision epoch over every transition collected so far (reward
centering, Naik et al. 2024): with rewards that are mostly costs, discounting
otherwise makes any action that lets time pass (a defer) look cheaper. ε decays linearly
from ``epsilon_start`` to ``epsilon_end`` and is 0 from episode
``explore_episodes`` on (the paper stops exploring after episode 20).

Each episode appends a row to the training curve (episode, reward, mean_e2e_s,
loss, q_mean, ...; a Polars table written to ``curve.parquet``). The exported
policy (``policy.npz``, numpy only, see ``policy.py``) is the greedy network,
among those at the end of each greedy episode, with the lowest mean E2E
(geometric mean over the workloads of each one's mean) on
``val_seeds`` fixed validation workloads (seeds just below the training seeds,
routed through ``ClusterSim.run`` like an evaluation); the last network when
there was no greedy episode. ``last/policy.npz`` holds the final network.
Validation uses the training predictor and, for a trace, windows of it at the
validation seeds. With ``validation_gate`` (the default) the exported network
and its guidance heuristic are then both validated on ``val_seeds`` further
workloads (fresh ones: those that selected the network flatter it), and unless the network beats the
heuristic by ``gate_margin_pct`` the checkpoint is marked ``gate = "heuristic"``: the router then routes with
the heuristic (a safeguard: a network is deployed only where it validated better
than its guidance). The policy's metadata records what it was trained on
(``trained_on``), the mixing parameters of its fallback heuristic and the
range of the states it was trained on (``obs_low``/``obs_high``, for the
router's out-of-distribution guard, see ``lbbench.routers.rl.policy``). Training workloads use
seeds ``train_seed_base + 1000 * seed + episode``, disjoint from the evaluation
seeds ``0..N`` that ``lbbench run --seeds N`` uses.

Determinism: one thread, seeded torch/numpy generators, and a simulator that is
deterministic for a workload seed: the same config gives the same curve.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch import nn

from lbbench import __version__
from lbbench.profiles import Profile, load_profile
from lbbench.routers.rl.features import FeatureSpec
from lbbench.routers.rl.policy import QPolicy, SharedQPolicy
from lbbench.training.config import TrainConfig
from lbbench.training.curve import CURVE_FILE, PLOT_FILE, LearningCurve, save_plot
from lbbench.training.env import RewardConfig, RouterEnv
from lbbench.training.episodes import episode_source


class QNetwork(nn.Module):
    """obs -> hidden -> hidden -> actions, ReLU (the paper's network)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, num_actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SharedQNetwork(nn.Module):
    """Permutation-equivariant Q-network (``--network shared``, a deviation from the
    paper's MLP): ``Q_i = f([head, x_i, mean_j x_j])`` with one MLP ``f`` shared by
    every instance, ``Q_defer = g([head, mean_j x_j])``. Exported as
    ``SharedQPolicy`` (numpy); see ``lbbench.routers.rl.policy``."""

    def __init__(self, head_dim: int, num_instances: int, per_instance_dim: int, hidden: int):
        super().__init__()
        self.h, self.m, self.k = head_dim, num_instances, per_instance_dim
        self.inst = nn.Sequential(nn.Linear(head_dim + 2 * per_instance_dim, hidden), nn.ReLU(),
                                  nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.defer = nn.Sequential(nn.Linear(head_dim + per_instance_dim, hidden), nn.ReLU(),
                                   nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        single = x.dim() == 1
        if single:
            x = x.unsqueeze(0)
        head = x[:, :self.h]
        inst = x[:, self.h:].reshape(-1, self.m, self.k)
        pooled = inst.mean(dim=1)
        xi = torch.cat([head.unsqueeze(1).expand(-1, self.m, -1), inst,
                        pooled.unsqueeze(1).expand(-1, self.m, -1)], dim=2)
        q = torch.cat([self.inst(xi).squeeze(2), self.defer(torch.cat([head, pooled], dim=1))], dim=1)
        return q.squeeze(0) if single else q


NETWORKS = ("mlp", "shared")


def make_network(cfg: TrainConfig, spec) -> nn.Module:
    """The Q-network ``cfg.network`` names, for a feature spec."""
    if cfg.network == "shared":
        head_dim = spec.obs_dim - cfg.instances * spec.per_instance_dim
        return SharedQNetwork(head_dim, cfg.instances, spec.per_instance_dim, cfg.hidden or 64)
    if cfg.network != "mlp":
        raise ValueError(f"network: {cfg.network!r} is not one of {', '.join(NETWORKS)}")
    return QNetwork(spec.obs_dim, cfg.instances + 1, cfg.hidden_width())


class ReplayBuffer:
    """Fixed-size ring buffer of transitions (numpy arrays)."""

    def __init__(self, capacity: int, obs_dim: int, num_actions: int):
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), np.float32)
        self.next_mask = np.zeros((capacity, num_actions), bool)
        self.action = np.zeros(capacity, np.int64)
        self.reward = np.zeros(capacity, np.float32)
        self.discount = np.zeros(capacity, np.float32)
        self.done = np.zeros(capacity, np.float32)
        self.capacity, self.size, self.pos = capacity, 0, 0

    def add(self, obs, action, reward, next_obs, next_mask, done, discount) -> None:
        i = self.pos
        self.obs[i], self.action[i], self.reward[i] = obs, action, reward
        self.next_obs[i], self.next_mask[i], self.done[i] = next_obs, next_mask, done
        self.discount[i] = discount
        self.pos = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, rng: np.random.Generator, n: int, permute: tuple[int, int, int] | None = None):
        """A batch of ``n`` transitions; with ``permute = (head_dim, num_instances,
        per_instance_dim)`` each is relabelled by a random instance permutation."""
        idx = rng.integers(0, self.size, size=n)
        obs, act, next_obs, mask = self.obs[idx], self.action[idx], self.next_obs[idx], self.next_mask[idx]
        if permute is not None:
            obs, act, next_obs, mask = permute_instances(rng, obs, act, next_obs, mask, *permute)
        return (torch.from_numpy(obs), torch.from_numpy(act), torch.from_numpy(self.reward[idx]),
                torch.from_numpy(next_obs), torch.from_numpy(mask), torch.from_numpy(self.done[idx]),
                torch.from_numpy(self.discount[idx]))

    def state_range(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-feature min and max over the stored states."""
        seen = self.obs[:self.size]
        return seen.min(axis=0), seen.max(axis=0)


class NStep:
    """Turns one-step transitions into ``n``-step ones: ``R = Σ_i (Π_{j<i} Γ_j) r_i``,
    ``Γ = Π_i Γ_i``, next state and done of the last. ``n = 1`` passes them through."""

    def __init__(self, n: int):
        self.n = n
        self.pending: list[list] = []

    def push(self, obs, action, reward, discount, next_obs, next_mask, done) -> list[tuple]:
        """Add a transition; returns those now complete (all pending ones at an episode end)."""
        for p in self.pending:  # p = [obs, action, R, Γ]
            p[2] += p[3] * reward
            p[3] *= discount
        self.pending.append([obs, action, reward, discount])
        out = []
        while self.pending and (len(self.pending) >= self.n or done):
            o, a, r, g = self.pending.pop(0)
            out.append((o, a, r, next_obs, next_mask, done, g))
        return out

    def flush(self, next_obs, next_mask, done) -> list[tuple]:
        out = [(o, a, r, next_obs, next_mask, done, g) for o, a, r, g in self.pending]
        self.pending = []
        return out


def permute_instances(rng: np.random.Generator, obs: np.ndarray, action: np.ndarray,
                      next_obs: np.ndarray, next_mask: np.ndarray, head_dim: int, m: int, k: int):
    """Relabel the (identical) instances of each transition by a random
    permutation: instance block ``j`` of the new observation is block
    ``perm[j]`` of the old one, so action ``a < m`` becomes ``inv[a]`` and the
    mask moves with the blocks; defer (action ``m``) is unchanged. The MDP is
    symmetric under this relabelling, so every stored transition teaches the
    network about all ``m!`` orderings (no instance can be learned to be
    "special")."""
    n = len(action)
    perm = np.argsort(rng.random((n, m)), axis=1)  # row i: a uniform permutation
    inv = np.argsort(perm, axis=1)
    rows = np.arange(n)[:, None]

    def blocks(x: np.ndarray) -> np.ndarray:
        inst = x[:, head_dim:].reshape(n, m, k)[rows, perm]
        return np.concatenate([x[:, :head_dim], inst.reshape(n, m * k)], axis=1)

    new_action = action.copy()
    routed = action < m
    new_action[routed] = inv[np.flatnonzero(routed), action[routed]]
    new_mask = next_mask.copy()
    new_mask[:, :m] = next_mask[:, :m][rows, perm]
    return blocks(obs), new_action, blocks(next_obs), new_mask


def _numpy_layers(seq: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(m.weight.detach().numpy().T.copy(), m.bias.detach().numpy().copy())
            for m in seq if isinstance(m, nn.Linear)]


def export_policy(q: nn.Module, meta: dict) -> QPolicy | SharedQPolicy:
    """The torch network as a numpy policy (weights transposed to (in, out))."""
    if isinstance(q, SharedQNetwork):
        meta = dict(meta, network={"arch": "shared", "head_dim": q.h, "num_instances": q.m,
                                   "per_instance_dim": q.k})
        return SharedQPolicy(_numpy_layers(q.inst), _numpy_layers(q.defer), meta)
    return QPolicy(_numpy_layers(q.net), dict(meta, network={"arch": "mlp"}))


def validate(policy: QPolicy | SharedQPolicy, profile: Profile, cfg: TrainConfig, workloads: list,
             heuristic: bool = False, seed_of: list[int] | None = None) -> float:
    """Geometric mean over fixed validation workloads of each one's mean E2E (s) under
    a greedy policy, routed by the numpy router through ``ClusterSim.run`` exactly
    as ``lbbench run`` does; with ``heuristic`` the router's guidance heuristic
    instead of the network. (The geometric mean weighs a workload at light load,
    seconds of E2E, as much as one in overload, minutes.)"""
    from lbbench.routers.rl.policy import ROUTER_CLASSES
    from lbbench.sim.cluster import ClusterSim
    with tempfile.TemporaryDirectory() as tmp:
        policy.save(tmp, meta=dict(policy.meta, gate="heuristic") if heuristic else None)
        router = ROUTER_CLASSES[cfg.router](cfg.instances, checkpoint=tmp)
    means = []
    for k, reqs in enumerate(workloads):
        sim_seed = seed_of[k] if seed_of else cfg.train_seed_base - 1 - k
        recs = ClusterSim(profile, cfg.instances, reqs, seed=sim_seed,
                          instance_scheduler=cfg.instance_scheduler,
                          chunked_prefill=cfg.chunked_prefill).run(router)
        means.append(np.mean([r.finish_s - r.arrival_s for r in recs if r.finish_s is not None]))
    return float(np.exp(np.mean(np.log(means))))


def epsilon_at(cfg: TrainConfig, episode: int) -> float:
    if episode >= cfg.explore_episodes:
        return 0.0
    frac = episode / max(1, cfg.explore_episodes - 1)
    return cfg.epsilon_start + frac * (cfg.epsilon_end - cfg.epsilon_start)


def train(cfg: TrainConfig, out_dir: str | Path | None = None, *, progress: bool = True,
          profile: Profile | None = None, ray_address: str | None = None) -> pl.DataFrame:
    """Train one variant; writes the checkpoint to ``out_dir`` (when given) and
    returns the training curve. With ``workers`` or a ``teacher`` the round-based
    loop over parallel rollouts (``rounds``) does it; ``ray_address`` puts its
    rollout workers on Ray."""
    if cfg.workers > 0 or cfg.teacher != "none" or ray_address:
        from lbbench.training.rounds import train_rounds
        return train_rounds(cfg, out_dir, progress=progress, profile=profile, ray_address=ray_address)
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    prof = profile or load_profile(cfg.profile)
    reward_cfg = RewardConfig(cfg.router, r_w=cfg.r_w, gamma=cfg.gamma, beta_d=cfg.beta_d,
                              guidance_scale=cfg.guidance_scale, guidance_schedule=cfg.guidance_schedule,
                              discount=cfg.discount, estimator=cfg.estimator)
    episodes = episode_source(cfg, prof)
    if cfg.prior_scale > 0 and cfg.permute_instances:
        raise ValueError("prior_scale: does not combine with permute_instances (use --network shared)")
    env = RouterEnv(prof, cfg.instances, episodes,
                    reward_cfg, instance_scheduler=cfg.instance_scheduler,
                    chunked_prefill=cfg.chunked_prefill, max_defer_s=cfg.max_defer_s,
                    prior_scale=cfg.prior_scale,
                    feature_spec=FeatureSpec.from_profile(prof, cfg.instances, kv_features=cfg.kv_features))
    obs_dim, n_act = env.feature_spec.obs_dim, cfg.instances + 1
    q = make_network(cfg, env.feature_spec)
    q_target = make_network(cfg, env.feature_spec)
    q_target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=cfg.lr)
    # with a residual prior, every stored state is [obs, prior] (the prior is fixed, not learned)
    residual = cfg.prior_scale > 0
    buf = ReplayBuffer(cfg.buffer_size, obs_dim + (n_act if residual else 0), n_act)

    def stored(o: np.ndarray, prior: np.ndarray) -> np.ndarray:
        return np.concatenate([o, prior]) if residual else o

    def q_total(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return net(x[..., :obs_dim]) + x[..., obs_dim:] if residual else net(x)
    spec = env.feature_spec
    permute = ((spec.obs_dim - cfg.instances * spec.per_instance_dim, cfg.instances,
                spec.per_instance_dim) if cfg.permute_instances else None)
    meta = checkpoint_meta(cfg, prof, env.feature_spec)

    validation = [episodes(cfg.train_seed_base - 1 - k) for k in range(cfg.val_seeds)]
    lc = LearningCurve(cfg, prof, validation, [cfg.train_seed_base - 1 - k for k in range(cfg.val_seeds)],
                       out_dir) if cfg.val_seeds > 0 else None
    rows: list[dict] = []
    best: tuple[float, QPolicy | SharedQPolicy] | None = None
    step = 0
    sum_reward, sum_epochs = 0.0, 0.0  # for reward centering
    t_start = time.perf_counter()
    bar = _progress_bar(progress, cfg)
    for episode in range(cfg.episodes):
        eps = epsilon_at(cfg, episode)
        wl_seed = cfg.train_seed_base + 1000 * cfg.seed + episode
        obs, info = env.reset(seed=wl_seed, options={"episode": episode})
        obs = stored(obs, info["prior"])
        ep_reward, losses, qs, n_dec, n_defer = 0.0, [], [], 0, 0
        nstep = NStep(cfg.n_step)
        done = False
        while not done:
            mask = info["action_mask"]
            if rng.random() < eps:
                action = int(rng.choice(np.flatnonzero(mask)))
            else:
                with torch.no_grad():
                    qv = q_total(q, torch.from_numpy(obs)).numpy()
                action = int(np.argmax(np.where(mask, qv, -np.inf)))
            next_obs, reward, terminated, truncated, info = env.step(action)
            next_obs = stored(next_obs, info["prior"])
            disc = reward_cfg.transition_discount(episode, info["epochs"])
            ep_reward += reward
            sum_reward += reward
            sum_epochs += info["epochs"]
            if cfg.reward_centering and sum_epochs > 0:
                reward -= sum_reward / sum_epochs * info["epochs"]
            if terminated and cfg.bootstrap_end:  # the stream goes on: bootstrap, do not terminate
                boot = stored(info["bootstrap_obs"], info["bootstrap_prior"])
                ready = nstep.push(obs, action, reward * cfg.reward_scale, disc, boot,
                                   info["bootstrap_mask"], False) + nstep.flush(boot, info["bootstrap_mask"], False)
            else:
                ready = nstep.push(obs, action, reward * cfg.reward_scale, disc, next_obs,
                                   info["action_mask"], terminated)
                if truncated:
                    ready += nstep.flush(next_obs, info["action_mask"], False)
            for t in ready:
                buf.add(*t)
            obs, done = next_obs, terminated or truncated
            n_dec += 1
            n_defer += action == cfg.instances
            step += 1

            if step >= cfg.learning_starts and step % cfg.train_every == 0:
                b_obs, b_act, b_rew, b_next, b_mask, b_done, b_disc = buf.sample(rng, cfg.batch_size, permute)
                with torch.no_grad():
                    online_next = q_total(q, b_next).masked_fill(~b_mask, -torch.inf)
                    best_next = online_next.argmax(dim=1, keepdim=True)
                    target_next = q_total(q_target, b_next).gather(1, best_next).squeeze(1)
                    target = b_rew + b_disc * target_next * (1.0 - b_done)
                q_taken = q_total(q, b_obs).gather(1, b_act.unsqueeze(1)).squeeze(1)
                loss = nn.functional.smooth_l1_loss(q_taken, target)
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q.parameters(), 10.0)
                opt.step()
                losses.append(float(loss.detach()))
                qs.append(float(q_taken.detach().mean()))
            if step % cfg.target_every == 0:
                q_target.load_state_dict(q.state_dict())

        recs = env.sim.records
        e2e = [r.finish_s - r.arrival_s for r in recs if r.finish_s is not None]
        wait = [r.dispatch_s - r.arrival_s for r in recs]
        row = {"episode": episode, "reward": ep_reward, "mean_e2e_s": float(np.mean(e2e)),
               "mean_router_wait_s": float(np.mean(wait)),
               "loss": float(np.mean(losses)) if losses else float("nan"),
               "q_mean": float(np.mean(qs)) if qs else float("nan"), "epsilon": eps,
               "guidance_weight": env.guidance_weight, "td_discount": reward_cfg.td_discount(episode),
               "decisions": n_dec, "defers": n_defer,
               "preemptions": int(sum(r.num_preemptions or 0 for r in recs)),
               "wall_s": time.perf_counter() - t_start}
        rows.append(row)
        row["val_e2e_s"] = float("nan")
        if eps == 0.0 and cfg.val_seeds > 0:
            policy = export_policy(q, dict(meta, episode=episode))
            row["val_e2e_s"] = validate(policy, prof, cfg, validation)
            if best is None or row["val_e2e_s"] < best[0]:
                best = (row["val_e2e_s"], policy)
        if lc is not None and ((episode + 1) % max(1, cfg.eval_every) == 0 or episode == cfg.episodes - 1):
            lc.record(episode + 1, export_policy(q, dict(meta, episode=episode)))
        bar.update(row)
    bar.close()

    curve = pl.DataFrame(rows)
    if out_dir is not None:
        low, high = buf.state_range()
        last = export_policy(q, dict(meta, episode=cfg.episodes - 1))
        save_checkpoint(cfg, prof, out_dir, best, last, (low[:obs_dim], high[:obs_dim]), episodes, curve,
                        lc.frame() if lc is not None else None)
    return curve


def checkpoint_meta(cfg: TrainConfig, prof: Profile, spec: FeatureSpec) -> dict:
    """What a checkpoint records about its training (``trained_on``, mixing, the config)."""
    return {"variant": cfg.router, "profile": prof.name, "num_instances": cfg.instances,
            "feature_spec": spec.as_dict(), "max_defer_s": cfg.max_defer_s,
            "trained_on": {"profile": prof.name, "num_instances": cfg.instances,
                           "workload": cfg.workload_label(), "rate_per_s": cfg.rate,
                           "rates_per_s": cfg.rate_list(),
                           "requests": cfg.requests, "predictor": cfg.predictor,
                           "instance_scheduler": cfg.instance_scheduler,
                           "chunked_prefill": (prof.chunked_prefill if cfg.chunked_prefill is None
                                               else cfg.chunked_prefill)},
            "mixing": {"grad1": prof.grad1, "grad2": prof.grad2, "epsilon": prof.epsilon,
                       "alpha": prof.alpha, "estimator": cfg.estimator},
            "prior_scale": cfg.prior_scale,
            "train_config": _jsonable(dataclasses.asdict(cfg)), "lbbench_version": __version__}


def save_checkpoint(cfg: TrainConfig, prof: Profile, out_dir: str | Path,
                    best: tuple[float, QPolicy | SharedQPolicy] | None, last: QPolicy | SharedQPolicy,
                    state_range: tuple[np.ndarray, np.ndarray], episodes, curve: pl.DataFrame,
                    learning_curve: pl.DataFrame | None) -> None:
    """Write the checkpoint: the selected network (``best``, else ``last``) with the
    state range and, with ``validation_gate``, the gate's verdict on fresh
    validation workloads; ``last/``; the training curve; the learning curve and
    its picture; the config."""
    out = Path(out_dir)
    ranges = {"obs_low": state_range[0].tolist(), "obs_high": state_range[1].tolist()}
    last.meta.update(ranges)
    chosen = best[1] if best else last
    chosen.meta.update(ranges)
    if best is not None and cfg.validation_gate:
        # fresh workloads: the selection seeds flatter the network they selected
        seeds = [cfg.train_seed_base - 1 - k for k in range(cfg.val_seeds, 2 * cfg.val_seeds)]
        gate_wl = [episodes(sd) for sd in seeds]
        net_e2e = validate(chosen, prof, cfg, gate_wl, seed_of=seeds)
        heuristic_e2e = validate(chosen, prof, cfg, gate_wl, heuristic=True, seed_of=seeds)
        chosen.meta["validation"] = {"network_e2e_s": net_e2e, "heuristic_e2e_s": heuristic_e2e,
                                     "seeds": seeds, "selection_e2e_s": best[0]}
        chosen.meta["validation"]["margin_pct"] = cfg.gate_margin_pct
        keep = net_e2e < heuristic_e2e * (1.0 - cfg.gate_margin_pct / 100.0)
        chosen.meta["gate"] = "network" if keep else "heuristic"
    chosen.save(out)
    last.save(out / "last")
    curve.write_parquet(out / "curve.parquet")
    if learning_curve is not None and learning_curve.height:
        learning_curve.write_parquet(out / CURVE_FILE)
        try:
            save_plot(learning_curve, out / PLOT_FILE, f"{cfg.router} {prof.name} x{cfg.instances}")
        except ImportError:
            pass  # the picture needs the plot extra; the CLI says so
    (out / "config.json").write_text(json.dumps(_jsonable(dataclasses.asdict(cfg)), indent=2) + "\n")


def _jsonable(d: dict) -> dict:
    """The config as plain JSON values (a trace column mapping becomes its text); a
    trace is recorded by its file name, not by where it lay on the training machine."""
    d = dict(d)
    if d.get("trace"):
        d["trace"] = Path(d["trace"]).name
    return json.loads(json.dumps(d, default=str))


class _progress_bar:
    """A rich progress bar over episodes (silent when disabled)."""

    def __init__(self, enabled: bool, cfg: TrainConfig):
        self.p = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            self.p = Progress(TextColumn(f"train {cfg.router}"), BarColumn(),
                              TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                              TextColumn("{task.fields[info]}"))
            self.p.start()
            self.task = self.p.add_task("episodes", total=cfg.episodes, info="")

    def update(self, row: dict) -> None:
        if self.p is not None:
            self.p.update(self.task, advance=1,
                          info=f"e2e {row['mean_e2e_s']:.2f}s reward {row['reward']:.3g} "
                               f"eps {row['epsilon']:.2f}")

    def close(self) -> None:
        if self.p is not None:
            self.p.stop()
