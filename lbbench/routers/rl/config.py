"""Training configuration for the RL routers (no torch import).

``TrainConfig``'s field docstrings double as ``lbbench train --help``
(``field_help`` reads them from the source), CleanRL style.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from dataclasses import dataclass


@dataclass
class TrainConfig:
    """Everything that defines a training run (written to ``config.json``)."""

    router: str = "wgrl"
    """RL variant: baseline_rl, wa_rl or wgrl."""
    profile: str = "llama2-7b-v100"
    """Profile name or path to a .toml file."""
    instances: int = 4
    """Number of simulated instances (the policy is specific to it)."""
    workload: str = "paper-mix"
    """Training workload (paper-mix)."""
    rate: float = 20.0
    """Arrival rate, requests per second."""
    requests: int = 2000
    """Requests per training episode."""
    episodes: int = 30
    """Training episodes."""
    seed: int = 0
    """Seed for the networks, exploration and the training workloads."""
    hidden: int = 0
    """Hidden layer width (0: 64 up to 4 instances, 128 above)."""
    lr: float = 5e-4
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
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
    guidance_scale: float = 100.0
    """Reward units per second of mixing impact (wa_rl, wgrl)."""
    max_defer_s: float = 30.0
    """A request may be deferred at most this long at the router."""
    instance_scheduler: str = "fcfs"
    """Instance-level scheduler of the simulated engines."""
    chunked_prefill: bool | None = None
    """Force chunked prefill on/off (default: the profile's)."""
    val_seeds: int = 2
    """Validation workloads that pick the exported network among the greedy episodes."""
    train_seed_base: int = 1_000_000
    """Offset of the training workload seeds (kept away from evaluation seeds)."""

    def hidden_width(self) -> int:
        return self.hidden or (64 if self.instances <= 4 else 128)


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
