"""The Double-DQN learner's parts (torch); the training loop is ``rounds.train``.

The Q-networks (``QNetwork``, the paper's MLP; ``SharedQNetwork``, the
permutation-equivariant deviation), the replay buffer (``ReplayBuffer``, with
the instance-permutation augmentation ``permute_instances``), ``n``-step
returns (``NStep``), the demonstrations of a teacher (``DemoBuffer``) and the
update, ``dqn_update``: one gradient step on the Double-DQN loss, smooth L1
between ``Q(s, a)`` and ``R + Γ · Q_target(s', argmax_a Q_online(s', a))``
(the argmax restricted to the next state's valid actions; ``Γ`` the
transition's discount, see ``env``), plus, with demonstrations, DQfD's
large-margin imitation loss (``margin_loss``), the gradient clipped to norm
``MAX_GRAD_NORM``, one Adam step.

Then what a checkpoint is made of: ``export_policy`` (the greedy network as a
numpy ``QPolicy``/``SharedQPolicy``, see ``lbbench.routers.rl.policy``),
``validate`` (mean E2E on validation workloads through ``ClusterSim.run``, as
``lbbench run`` routes), ``checkpoint_meta`` (what it was trained on, the
mixing parameters of its fallback heuristic; with a deployable router as teacher, ``fallback``: that
router) and ``save_checkpoint`` (the
selected network with the range of its training states, for the router's
out-of-distribution guard; ``last/``; the curves; ``config.json``; and with
``validation_gate`` the gate's verdict: unless the network beats its guidance
heuristic by ``gate_margin_pct`` on fresh validation workloads, the checkpoint
is marked ``gate = "heuristic"`` and the router routes with the heuristic).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch import nn

from lbbench import __version__
from lbbench.profiles import Profile
from lbbench.routers.rl.features import FeatureSpec
from lbbench.routers.rl.policy import ROUTER_CLASSES, QPolicy, SharedQPolicy
from lbbench.training.config import TrainConfig
from lbbench.training.curve import CURVE_FILE, PLOT_FILE, save_plot
from lbbench.training.episodes import make_sim
from lbbench.training.teachers import ROUTER_TEACHERS

MAX_GRAD_NORM = 10.0  #: every update's gradient is clipped to this norm


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
    """DQfD's large-margin loss over the valid actions (Hester et al. 2018):
    ``max_a [Q(s, a) + margin · 1(a ≠ a_T)] − Q(s, a_T)``."""
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


def dqn_update(q: nn.Module, q_target: nn.Module, opt: torch.optim.Optimizer, batch: tuple,
               demo: tuple | None = None, demo_weight: float = 0.0, margin: float = 0.5) -> tuple[float, float]:
    """One gradient step on the Double-DQN loss of a replay ``batch`` (``ReplayBuffer.sample``),
    plus ``demo_weight`` times the margin loss on a ``demo`` batch (``DemoBuffer.sample``) when
    given; returns the loss and the mean ``Q(s, a)`` of the batch."""
    b_obs, b_act, b_rew, b_next, b_mask, b_done, b_disc = batch
    with torch.no_grad():
        best_next = q(b_next).masked_fill(~b_mask, -torch.inf).argmax(dim=1, keepdim=True)
        target = b_rew + b_disc * q_target(b_next).gather(1, best_next).squeeze(1) * (1.0 - b_done)
    q_taken = q(b_obs).gather(1, b_act.unsqueeze(1)).squeeze(1)
    loss = nn.functional.smooth_l1_loss(q_taken, target)
    if demo is not None:
        d_obs, d_mask, d_act = demo
        loss = loss + demo_weight * margin_loss(q(d_obs), d_mask, d_act, margin)
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(q.parameters(), MAX_GRAD_NORM)
    opt.step()
    return float(loss.detach()), float(q_taken.detach().mean())


class Learner:
    """What the learner holds: the online and target networks, Adam, the replay and
    demonstration buffers, the running reward per epoch (reward centering) and the
    update count. Its generator ``rng`` draws every batch."""

    def __init__(self, cfg: TrainConfig, spec: FeatureSpec, reward_cfg, rng: np.random.Generator):
        self.cfg, self.reward_cfg, self.rng = cfg, reward_cfg, rng
        self.q, self.q_target = make_network(cfg, spec), make_network(cfg, spec)
        self.q_target.load_state_dict(self.q.state_dict())
        self.opt = torch.optim.Adam(self.q.parameters(), lr=cfg.lr)
        n_act = cfg.instances + 1
        self.buf = ReplayBuffer(cfg.buffer_size, spec.obs_dim, n_act)
        self.demo = DemoBuffer(cfg.buffer_size, spec.obs_dim, n_act)
        self.permute = ((spec.obs_dim - cfg.instances * spec.per_instance_dim, cfg.instances,
                         spec.per_instance_dim) if cfg.permute_instances else None)
        self.updates = 0
        self.sum_reward, self.sum_epochs = 0.0, 0.0

    def store(self, tr) -> None:
        """An episode's transitions (``rollouts.Transitions``) into the replay buffer, each reward
        centred (with ``reward_centering``: minus the running mean per epoch times its epochs),
        scaled and discounted by the epochs it spans (``n_step`` returns); its teacher-labelled
        states into the demonstrations."""
        cfg, nstep = self.cfg, NStep(self.cfg.n_step)
        for i in range(len(tr)):
            reward, epochs = float(tr.reward[i]), float(tr.epochs[i])
            self.sum_reward += reward
            self.sum_epochs += epochs
            if cfg.reward_centering and self.sum_epochs > 0:
                reward -= self.sum_reward / self.sum_epochs * epochs
            disc = self.reward_cfg.transition_discount(tr.task.schedule_episode, epochs)
            for t in nstep.push(tr.obs[i], tr.action[i], reward * cfg.reward_scale, disc, tr.next_obs[i],
                                tr.next_mask[i], bool(tr.done[i])):
                self.buf.add(*t)
        for t in nstep.flush(tr.next_obs[-1], tr.next_mask[-1], False) if len(tr) else []:
            self.buf.add(*t)
        labelled = tr.teacher_action >= 0
        if labelled.any():
            self.demo.add(tr.obs[labelled], tr.mask[labelled], tr.teacher_action[labelled])

    def fit(self, n_updates: int, demo_weight: float) -> tuple[float, float]:
        """Up to ``n_updates`` ``dqn_update`` steps (none before ``learning_starts`` transitions),
        the target network synced every ``target_every`` decisions' worth of updates; returns
        the mean loss and ``Q(s, a)`` (NaN without an update)."""
        cfg = self.cfg
        losses, qs = [], []
        sync = max(1, cfg.target_every // max(1, cfg.train_every))
        for _ in range(n_updates):
            if self.buf.size < max(1, cfg.learning_starts):
                break
            batch = self.buf.sample(self.rng, cfg.batch_size, self.permute)
            demo = self.demo.sample(self.rng, cfg.batch_size) if demo_weight > 0 and self.demo.size else None
            loss, q_mean = dqn_update(self.q, self.q_target, self.opt, batch, demo, demo_weight, cfg.margin)
            self.updates += 1
            if self.updates % sync == 0:
                self.q_target.load_state_dict(self.q.state_dict())
            losses.append(loss)
            qs.append(q_mean)
        return (float(np.mean(losses)) if losses else float("nan"), float(np.mean(qs)) if qs else float("nan"))

    def disagreement(self, policy, sample: bool = True) -> float:
        """``disagreement`` with the teacher on ``disagreement_sample`` demonstrations drawn at
        random (all of them with ``sample=False``); NaN without demonstrations."""
        d = self.demo
        if not d.size:
            return float("nan")
        if not sample:
            return disagreement(policy, d.obs[:d.size], d.mask[:d.size], d.action[:d.size])
        k = self.rng.integers(0, d.size, size=min(d.size, self.cfg.disagreement_sample))
        return disagreement(policy, d.obs[k], d.mask[k], d.action[k])


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
    with tempfile.TemporaryDirectory() as tmp:
        policy.save(tmp, meta=dict(policy.meta, gate="heuristic") if heuristic else None)
        router = ROUTER_CLASSES[cfg.router](cfg.instances, checkpoint=tmp)
    means = []
    for k, reqs in enumerate(workloads):
        sim_seed = seed_of[k] if seed_of else cfg.validation_seeds(len(workloads))[k]
        recs = make_sim(cfg, profile, reqs, sim_seed).run(router)
        means.append(np.mean([r.finish_s - r.arrival_s for r in recs if r.finish_s is not None]))
    return float(np.exp(np.mean(np.log(means))))


def epsilon_at(cfg: TrainConfig, episode: int) -> float:
    if episode >= cfg.explore_episodes:
        return 0.0
    frac = episode / max(1, cfg.explore_episodes - 1)
    return cfg.epsilon_start + frac * (cfg.epsilon_end - cfg.epsilon_start)


def checkpoint_meta(cfg: TrainConfig, prof: Profile, spec: FeatureSpec) -> dict:
    """What a checkpoint records about its training (``trained_on``, mixing, the config; with a fleet,
    ``fleet`` and ``trained_on.fleet``: its spec)."""
    meta = {"variant": cfg.router, "profile": prof.name, "num_instances": cfg.instances,
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
            "train_config": _jsonable(dataclasses.asdict(cfg)), "lbbench_version": __version__}
    if cfg.fleet:
        meta["fleet"] = meta["trained_on"]["fleet"] = cfg.fleet
    if cfg.teacher in ROUTER_TEACHERS:  # the router's fallback (OOD guard, gate): its deployable teacher
        meta["fallback"] = cfg.teacher
    return meta


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
        seeds = cfg.validation_seeds(cfg.val_seeds, skip=cfg.val_seeds)
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
            where = f"fleet {cfg.fleet}" if cfg.fleet else f"{prof.name} x{cfg.instances}"
            save_plot(learning_curve, out / PLOT_FILE, f"{cfg.router} {where}")
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
