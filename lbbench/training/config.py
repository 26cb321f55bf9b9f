"""Training configuration for the RL routers (no torch import).

``TrainConfig``'s field docstrings double as ``lbbench train --help``
(``field_help`` reads them from the source), CleanRL style. The defaults are
the paper's formulation (Jain et al., arXiv 2408.13510): decision epochs of
``Δt = profile.min_step_s`` with the discount ``γ`` per epoch, the fading
guidance schedule of heuristic-guided RL, the paper's mixing estimator. Every
deviation from it is a named field (``reward_scale``, ``n_step``,
``bootstrap_end``, ``permute_instances``, ``guidance_scale``, ...).

``RECIPES`` names whole settings: ``imitation`` is the recipe of the shipped
wgrl checkpoints (a teacher, behaviour cloning, DAgger, then Double DQN; see
``lbbench/checkpoints/README.md``) and what ``lbbench train`` uses unless told
otherwise; ``paper`` is the dataclass defaults. ``recipe(name, **overrides)``
builds a config from one.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from dataclasses import dataclass
from pathlib import Path

from lbbench.fleet import parse_fleet


@dataclass
class TrainConfig:
    """Everything that defines a training run (written to ``config.json`` and
    into the checkpoint's metadata, so a checkpoint records what it was trained on)."""

    router: str = "wgrl"
    """RL variant: baseline_rl, wa_rl or wgrl."""
    profile: str = "llama2-7b-v100"
    """Profile name or path to a .toml file."""
    instances: int = 4
    """Number of simulated instances (the policy is specific to it)."""
    fleet: str | None = None
    """Train on a mixed fleet, NAME_OR_PATH:COUNT[,NAME_OR_PATH:COUNT...] (`lbbench run --fleet`): instance i simulates the profile of the entry it falls in; sets --profile to the first entry's and --instances to the fleet's size. Pair it with --capacity-features and a capacity-aware teacher."""
    workload: str = "paper-mix"
    """Training workload when no --trace is given: paper-mix | paper-classes | poisson | dataset:FILE."""
    trace: str = ""
    """Train on a trace file (any format `lbbench run --trace` reads); episodes are windows of it."""
    trace_options: dict = dataclasses.field(default_factory=dict)
    """Trace reading/transform options (the trace flags of `lbbench run`)."""
    predictor: str = "oracle"
    """Output-length predictor used in training and validation (use the one you will evaluate with)."""
    rate: float = 20.0
    """Arrival rate, requests per second (a trace is rescaled to it; 0 keeps a trace's own rate)."""
    rates: str = ""
    """Deviation (a safeguard): comma-separated arrival rates, e.g. 4,7,10,20; episode and validation workload k use rate k mod their number (overrides --rate), so the network sees light load, saturation and overload."""
    requests: int = 2000
    """Requests per training episode (a trace window of this many consecutive requests)."""
    episodes: int = 30
    """Training episodes."""
    seed: int = 0
    """Seed for the networks, exploration and the training workloads."""
    seed_stride: int = 1000
    """Training workload k of a run has seed train_seed_base + seed_stride * seed + k (k counts every episode, all phases), so runs with different seeds replay different workloads as long as they have fewer episodes than this."""
    network: str = "mlp"
    """Q-network: mlp (the paper's, obs -> hidden -> hidden -> actions) | shared (deviation: one MLP scores every instance from [head, instance, mean over instances] plus one for defer; permutation-equivariant)."""
    hidden: int = 0
    """Hidden layer width (0: mlp 64 up to 4 instances, 128 above; shared 64)."""
    lr: float = 5e-4
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount per decision epoch Δt (the paper's γ)."""
    discount: str = "time"
    """time: a transition is discounted γ^(elapsed/Δt), one epoch per Δt as in the paper's MDP; decision: γ per decision (lbbench's earlier variant)."""
    guidance_schedule: str = "fading"
    """wgrl: fading = heuristic-guided RL (λ_k = 1 - exp(-β_d k) rises to 1, guidance weight (1 - λ_k)γ fades, TD discount λ_kγ); literal = the paper's printed weight γ - exp(-β_d k)γ with TD discount γ."""
    estimator: str = "paper"
    """Mixing estimator for the guidance: paper (r_mix over the KV held) or interference."""
    n_step: int = 1
    """n-step returns (deviation; 1 = the paper's one-step Double-DQN target)."""
    reward_centering: bool = False
    """Deviation: subtract the running mean reward per decision epoch (times the epochs a transition spans) from every reward, so discounting no longer favours actions that let time pass (with costs only, a defer postpones them)."""
    bootstrap_end: bool = False
    """Deviation: do not treat the end of an episode's routing as terminal; bootstrap from the last state (the trace goes on)."""
    batch_size: int = 512
    """Replay batch size."""
    buffer_size: int = 200_000
    """Replay buffer capacity (transitions)."""
    learning_starts: int = 2_000
    """Decisions collected before the first update."""
    train_every: int = 4
    """Decisions between gradient updates."""
    target_every: int = 1_000
    """Decisions between target-network syncs."""
    epsilon_start: float = 1.0
    """Initial exploration rate."""
    epsilon_end: float = 0.05
    """Exploration rate reached at the last exploring episode."""
    explore_episodes: int = 20
    """Episodes with exploration; greedy from then on."""
    permute_instances: bool = False
    """Relabel instances by a random permutation in every replayed transition (symmetry augmentation)."""
    reward_scale: float = 1e-3
    """Rewards are multiplied by this before learning (keeps Q values O(1-100))."""
    r_w: float = 60.0
    """Reward per completed request."""
    beta_d: float = 0.5
    """wgrl guidance annealing rate per episode."""
    guidance_scale: float = 1.0
    """Multiplies the guidance gap h (1 = the paper's; a deviation otherwise)."""
    max_defer_s: float = 30.0
    """A request may be deferred at most this long at the router (0: never defer while an instance is up)."""
    instance_scheduler: str = "fcfs"
    """Instance-level scheduler of the simulated engines."""
    chunked_prefill: bool | None = None
    """Force chunked prefill on/off (default: the profile's)."""
    validation_gate: bool = True
    """Safeguard: also validate the guidance heuristic; when it beats the exported network, mark the checkpoint so that the router routes with the heuristic (`--router-opt wgrl.gate=false` overrides)."""
    gate_margin_pct: float = 1.0
    """The validation gate keeps the network only when it beats the heuristic by at least this much (percent of the heuristic's mean E2E): a tie on a few workloads is noise, and the heuristic is the safer bet."""
    val_seeds: int = 2
    """Validation workloads that pick the exported network among the greedy episodes."""
    train_seed_base: int = 1_000_000
    """Offset of the training workload seeds (kept away from evaluation seeds)."""
    eval_every: int = 5
    """Learning curve: evaluate the greedy network (and, once, its guidance heuristic and round robin) on the validation workloads every this many episodes, all phases counted, and at most every half run, so a run of 4 or more episodes is evaluated at least twice (learning_curve.parquet / .png)."""
    kv_features: bool = False
    """Deviation: add predicted-KV-footprint features to the state (the head's predicted footprint; per instance its outstanding footprint, the KV held, and whether the head fits), from predicted lengths only."""
    capacity_features: bool = False
    """Deviation for mixed fleets: add each instance's decode and prefill speed relative to the fleet's fastest, its KV capacity relative to the largest and its expected drain time (its own speeds) to the state, from the instances' specs only; counts and KV figures become fractions of each instance's own limits."""
    workers: int = 0
    """Rollout workers: training goes in rounds of max(1, N) episodes collected with the current network, then the updates their decisions pay for (one per --train-every decisions). 0 or 1: one worker in the learner's process; N >= 2: a process pool (or Ray actors with --ray). Reproducible for a fixed seed and N."""
    teacher: str = "none"
    """Imitation warm start from a teacher (a function state -> action; it may read true lengths, the network never does): kv_gate (head-of-queue FIFO KV gate on true lengths) | lookahead (the oracle planner) | least_work_speed, jsq_speed (the capacity-aware heuristics, for mixed fleets; deployable) | none."""
    guidance: str = "mixing"
    """Guidance heuristic h of wa_rl/wgrl: mixing (the paper's r_mix gap) | kv_gate | lookahead (h = 1 when the action differs from that teacher's)."""
    bc_episodes: int = 0
    """Behaviour cloning: episodes acted by the teacher whose states and actions warm-start the network (needs --teacher)."""
    dagger_rounds: int = 0
    """DAgger rounds after behaviour cloning: the learner acts (the teacher with probability dagger_beta_decay^round), the teacher labels every visited state, the network is refitted on all labels."""
    dagger_beta_decay: float = 0.5
    """DAgger's mixture schedule: in round r (from 1) each action is the teacher's with probability β = dagger_beta_decay^r (Ross et al. 2011's geometric schedule)."""
    disagreement_sample: int = 2000
    """The training curve's teacher_disagreement: share of this many teacher-labelled states (drawn from the demonstrations each round) where the greedy network's action is not the teacher's."""
    imitation_updates: int = 2000
    """Gradient steps after the behaviour-cloning episodes and after each DAgger round."""
    margin: float = 0.5
    """Large-margin imitation loss (DQfD): the teacher's action must beat every other valid action's Q by this much (scaled reward units)."""
    demo_weight: float = 1.0
    """Weight of the imitation loss on the teacher-labelled states during Double-DQN fine-tuning (0: plain Double DQN after the warm start)."""

    def fleet_profiles(self) -> list | None:
        """One profile per instance of ``fleet`` (``lbbench.fleet.parse_fleet``), or None without one."""
        if not self.fleet:
            return None
        return parse_fleet(self.fleet).profiles()

    def for_fleet(self) -> "TrainConfig":
        """With a fleet: this config with ``profile`` the first entry's and ``instances`` the fleet's size."""
        profiles = self.fleet_profiles()
        if profiles is None:
            return self
        return dataclasses.replace(self, profile=profiles[0].name, instances=len(profiles))

    def workload_label(self) -> str:
        """What the checkpoint was trained on, as ``lbbench run`` labels workloads."""
        return f"trace:{Path(self.trace).name}" if self.trace else self.workload

    def rate_list(self) -> list[float]:
        """The training rates: ``rates`` parsed, else ``[rate]``."""
        if not self.rates.strip():
            return [self.rate]
        try:
            out = [float(x) for x in self.rates.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"rates: {self.rates!r} is not a comma-separated list of numbers") from None
        if not out or any(not r > 0 for r in out):
            raise ValueError(f"rates: {self.rates!r}: every rate must be > 0")
        return out

    def hidden_width(self) -> int:
        return self.hidden or (64 if self.instances <= 4 else 128)

    def workload_seed(self, k: int) -> int:
        """Seed of training workload ``k`` (every episode counts, all phases)."""
        return self.train_seed_base + self.seed_stride * self.seed + k

    def validation_seeds(self, n: int, skip: int = 0) -> list[int]:
        """``n`` validation workload seeds just below the training seeds, after the first ``skip``
        (the learning curve uses the first ``val_seeds``; the validation gate the next, fresh ones)."""
        return [self.train_seed_base - 1 - k for k in range(skip, skip + n)]


#: The shipped wgrl checkpoints' settings (``lbbench/checkpoints/wgrl/llama2-7b-v100-4x/config.json``)
#: where they differ from the defaults: a kv_gate teacher, 4 behaviour-cloning episodes, 8 DAgger rounds
#: on 2 workers, then 12 Double-DQN episodes of the shared network with reward centering.
IMITATION = {"predictor": "noisy:0.79", "episodes": 12, "network": "shared", "lr": 2e-4, "reward_centering": True,
             "epsilon_start": 0.05, "epsilon_end": 0.0, "explore_episodes": 4, "beta_d": 0.1,
             "guidance_scale": 10.0, "max_defer_s": 120.0, "eval_every": 2, "kv_features": True, "workers": 2,
             "teacher": "kv_gate", "bc_episodes": 4, "dagger_rounds": 8}

#: Named settings, the first the default of ``lbbench train``: imitation (the recipe that learned the
#: shipped checkpoints) and paper (the dataclass defaults, the paper's formulation: no teacher).
RECIPES: dict[str, dict] = {"imitation": IMITATION, "paper": {}}


def recipe(name: str, **overrides) -> TrainConfig:
    """The config of a named recipe, with ``overrides`` on top."""
    if name not in RECIPES:
        raise ValueError(f"recipe: {name!r} is not one of {', '.join(RECIPES)}")
    return TrainConfig(**{**RECIPES[name], **overrides})


def field_help() -> dict[str, str]:
    """``{field name: its docstring}`` for ``TrainConfig``."""
    tree = ast.parse(inspect.getsource(TrainConfig))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            out[node.target.id] = " ".join(nxt.value.value.split())
    missing = {f.name for f in dataclasses.fields(TrainConfig)} - set(out)
    if missing:
        raise AssertionError(f"TrainConfig fields without a docstring: {sorted(missing)}")
    return out
