"""The workload-guided RL router (Jain et al.): three Double-DQN variants that
route with a numpy forward pass (no torch at run time).

Importing this package registers ``baseline_rl``, ``wa_rl`` and ``wgrl`` with
the router registry. Training (``trainer``, torch) and the Gymnasium
environment (``env``) are imported only by ``lbbench train``.
"""

from __future__ import annotations

from lbbench.routers.registry import register
from lbbench.routers.rl.policy import (
    BaselineRL,
    CheckpointError,
    RLRouter,
    WorkloadAwareRL,
    WorkloadGuidedRL,
)

__all__ = ["BaselineRL", "CheckpointError", "RLRouter", "WorkloadAwareRL", "WorkloadGuidedRL"]

register("baseline_rl", "Double-DQN router, queue and completion reward only (the paper's baseline RL)")(
    BaselineRL)
register("wa_rl", "Double-DQN router with the mixing penalty as a constant-weight reward term")(
    WorkloadAwareRL)
register("wgrl", "workload-guided Double-DQN router: mixing penalty as annealed guidance (the paper's)")(
    WorkloadGuidedRL)
