"""The learning curve of a training run: network vs its guidance heuristic vs round robin.

``LearningCurve.record(episode, policy)`` routes the fixed validation
workloads (seeds just below the training seeds, never an evaluation seed)
through ``ClusterSim.run`` with the greedy network (the gate off), exactly as
``lbbench run --router-opt wgrl.gate=false`` would, and appends one row per
policy to a long table:

``episode`` (episodes trained so far), ``policy`` ∈ {``network``,
``heuristic``, ``round_robin``} (and the teacher when it is a deployable
router, ``least_work_speed`` or ``jsq_speed``), ``mean_e2e_s`` and ``p99_e2e_s`` (over every
request of the validation workloads) and ``preemptions`` (their sum).

The heuristic (the least mixing impact, the router's gate fallback) and round
robin do not learn, so they are evaluated once and repeated at every point.
With an output directory the table is rewritten to ``learning_curve.parquet``
after every point (an interrupted run keeps what it had) and ``save_plot``
draws ``learning_curve.png`` (matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from lbbench.core import ClusterView, Decision, Request
from lbbench.routers.mixing import MixingParams, least_impact_instance, penalties
from lbbench.routers.registry import get_router
from lbbench.routers.rl.policy import ROUTER_CLASSES
from lbbench.training.episodes import make_sim

CURVE_FILE = "learning_curve.parquet"
PLOT_FILE = "learning_curve.png"
POLICIES = ("network", "heuristic", "round_robin")
#: teachers that are routers of the registry (``teachers.ROUTER_TEACHERS``): the curve shows them too
ROUTER_TEACHERS = ("least_work_speed", "jsq_speed")
SCHEMA = {"episode": pl.Int64, "policy": pl.Utf8, "mean_e2e_s": pl.Float64, "p99_e2e_s": pl.Float64,
          "preemptions": pl.Int64}


class MixingHeuristic:
    """The guidance heuristic as a router: the head of the queue to the healthy
    instance with the least mixing penalty (what a gated checkpoint routes with)."""

    name = "heuristic"
    needs_detail = False

    def __init__(self, params: MixingParams, estimator: str = "paper"):
        self.params, self.estimator = params, estimator

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        healthy = view.healthy_indices()
        if not queue or not healthy:
            return None
        return Decision(0, least_impact_instance(penalties(self.params, view, queue[0], self.estimator), healthy))


def evaluate(router_factory, profile, cfg, workloads: Sequence[Sequence[Request]],
             seeds: Sequence[int]) -> dict:
    """Mean and p99 E2E (s) and preemptions of a router over the workloads (a fresh router per workload)."""
    e2e, preempt = [], 0
    for reqs, seed in zip(workloads, seeds):
        recs = make_sim(cfg, profile, reqs, seed).run(router_factory())
        e2e += [r.finish_s - r.arrival_s for r in recs if r.finish_s is not None]
        preempt += sum(r.num_preemptions or 0 for r in recs)
    a = np.asarray(e2e)
    return {"mean_e2e_s": float(a.mean()), "p99_e2e_s": float(np.percentile(a, 99)), "preemptions": int(preempt)}


def evaluate_network(policy, profile, cfg, workloads, seeds) -> dict:
    """``evaluate`` for a numpy policy routed by the RL router with the gate off."""
    with tempfile.TemporaryDirectory() as tmp:
        policy.save(tmp)
        return evaluate(lambda: ROUTER_CLASSES[cfg.router](cfg.instances, checkpoint=tmp, gate=False),
                        profile, cfg, workloads, seeds)


class LearningCurve:
    """Network vs heuristic vs round robin on fixed validation workloads."""

    def __init__(self, cfg, profile, workloads: Sequence[Sequence[Request]], seeds: Sequence[int],
                 out_dir: str | Path | None = None):
        self.cfg, self.profile, self.workloads, self.seeds = cfg, profile, list(workloads), list(seeds)
        self.path = Path(out_dir) / CURVE_FILE if out_dir is not None else None
        self.rows: list[dict] = []
        mixing = MixingParams.from_profile(profile)
        self.fixed = {
            "heuristic": evaluate(lambda: MixingHeuristic(mixing, cfg.estimator), profile, cfg,
                                  self.workloads, self.seeds),
            "round_robin": evaluate(lambda: get_router("round_robin", num_instances=cfg.instances, profile=profile),
                                    profile, cfg, self.workloads, self.seeds)}
        if cfg.teacher in ROUTER_TEACHERS:  # a deployable teacher (a capacity-aware heuristic) is a router too
            self.fixed[cfg.teacher] = evaluate(
                lambda: get_router(cfg.teacher, num_instances=cfg.instances, profile=profile),
                profile, cfg, self.workloads, self.seeds)

    def record(self, episode: int, policy) -> dict:
        """Evaluate the network after ``episode`` episodes; returns its row."""
        net = evaluate_network(policy, self.profile, self.cfg, self.workloads, self.seeds)
        for name, res in (("network", net), *self.fixed.items()):
            self.rows.append({"episode": episode, "policy": name, **res})
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.frame().write_parquet(self.path)
        return net

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.rows, schema=SCHEMA)


def save_plot(curve: pl.DataFrame, path: str | Path, title: str = "") -> Path:
    """Draw mean and p99 E2E against episodes, one line per policy (needs matplotlib)."""
    import matplotlib  # lazy: matplotlib is the optional plot extra
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib is the optional plot extra

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, col, label in ((axes[0], "mean_e2e_s", "mean E2E (s)"), (axes[1], "p99_e2e_s", "p99 E2E (s)")):
        extra = [p for p in curve["policy"].unique(maintain_order=True).to_list() if p not in POLICIES]
        for name, style in zip((*POLICIES, *extra), ("-o", "--", ":", "-.", "-.")):
            part = curve.filter(pl.col("policy") == name).sort("episode")
            if part.height:
                ax.plot(part["episode"].to_list(), part[col].to_list(), style, label=name, markersize=3)
        ax.set_xlabel("episodes trained")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    if title:
        fig.suptitle(title + " (validation workloads)")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
