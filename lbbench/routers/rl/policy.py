"""Routing with a trained Q-network, in numpy only (no torch at run time).

A checkpoint is a directory holding ``policy.npz``: the MLP's weights
``w0, b0, w1, b1, ...`` (``w`` of shape ``(in, out)``, float32) and ``meta``, a
JSON string with the variant, profile, instance count, the ``FeatureSpec`` and
the defer guard it was trained with. ``QPolicy`` evaluates
``relu(relu(x W0 + b0) W1 + b1) W2 + b2`` and ``RLRouter`` takes the argmax over
the valid actions for the head of the queue: action ``i < m`` sends it to
instance ``i``, action ``m`` defers (the dispatcher then tries again at the next
decision epoch).

``SharedQPolicy`` (``meta["network"]["arch"] == "shared"``, ``lbbench train
--network shared``) is the permutation-equivariant alternative: one small MLP
scores every instance from ``[head, instance i, mean over instances]`` and a
second scores *defer* from ``[head, mean over instances]``. The instances are
interchangeable, so relabelling them relabels the Q-values the same way, by
construction rather than by learning every ordering separately (the plain MLP's
weakness); its weights are stored as ``iw*/ib*`` and ``dw*/db*``.
``load_policy`` reads either.

Without an explicit checkpoint the router uses the one shipped in
``lbbench/checkpoints/<variant>/<profile>-<m>x[-<workload>]/``: the one trained
on the run's workload when there is one (``workload=`` router option, e.g.
``trace:AzureLLMInferenceTrace_conv.csv``), else the general one;
``CheckpointError`` (a ``ValueError``) names what exists and how to train one
when none matches. On a mixed fleet (``fleet=``, a ``lbbench.fleet.Fleet`` or
its spec) it is the one whose ``config.json`` records that fleet
(``shipped_fleet_checkpoint``; ``lbbench train --fleet``), e.g.
``wgrl/llama3.1-8b-f1-a100x2-l4x2/``, and of those the one trained on the run's
engine scheduler (``instance_scheduler=``; ``config.json``'s
``instance_scheduler``), else the FCFS one.

**Out-of-distribution guard** (``ood_guard=True``, the default). A Q-network
is only trustworthy on states like those it was trained on. A checkpoint
records the per-feature range of its training states (``obs_low`` /
``obs_high``); when a state leaves that box by more than ``ood_margin`` (the
features are O(1)-scaled), the router does not consult the network and routes
with its guidance heuristic instead: the least mixing penalty (the paper's
``r_mix``, ``lbbench.routers.mixing``) with the profile's parameters recorded
in the checkpoint. ``num_fallbacks`` counts those decisions. A checkpoint
whose metadata names a ``fallback`` router (one trained with a deployable
router as its teacher, ``lbbench train --teacher least_work_speed`` on a mixed
fleet) falls back to that router instead, here and under the validation gate:
on a fleet of unequal instances the mixing penalty is blind to speed.

**Validation gate** (``gate=True``, the default). Training validates the
exported network *and* its guidance heuristic on the same validation workloads
(seeds disjoint from any evaluation seed) and records both in
``meta["validation"]``; unless the network did better by the training's
``gate_margin_pct`` (1 % by default), ``meta["gate"]`` is ``"heuristic"`` and the router routes every decision with the heuristic (each
counted in ``num_fallbacks``): a network that lost to its own guidance where it
was trained is not deployed. ``gate=false`` routes with the network anyway.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lbbench.core import ClusterView, Decision, Request
from lbbench.errors import InputError
from lbbench.routers.mixing import MixingParams, heuristic_prior, least_impact_instance, penalties
from lbbench.routers.registry import get_router
from lbbench.routers.rl.features import Featurizer, FeatureSpec, action_mask

POLICY_FILE = "policy.npz"
SHIPPED_DIR = Path(__file__).resolve().parent.parent.parent / "checkpoints"
VARIANTS = ("baseline_rl", "wa_rl", "wgrl")


class CheckpointError(InputError):
    """A checkpoint is missing, unreadable or does not fit the run (bad input: the CLI names the flag)."""


class QPolicy:
    """A ReLU MLP forward pass over float32 numpy arrays."""

    def __init__(self, weights: Sequence[tuple[np.ndarray, np.ndarray]], meta: dict[str, Any]):
        if not weights:
            raise CheckpointError("policy has no layers")
        self.layers = [(np.ascontiguousarray(w, dtype=np.float32),
                        np.ascontiguousarray(b, dtype=np.float32)) for w, b in weights]
        for (w0, _), (w1, _) in zip(self.layers, self.layers[1:]):
            if w0.shape[1] != w1.shape[0]:
                raise CheckpointError(f"policy layer shapes do not chain: {w0.shape} -> {w1.shape}")
        self.meta = meta
        self.obs_dim = self.layers[0][0].shape[0]
        self.num_actions = self.layers[-1][0].shape[1]

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        h = obs
        last = len(self.layers) - 1
        for i, (w, b) in enumerate(self.layers):
            h = h @ w
            h += b
            if i < last:
                np.maximum(h, 0.0, out=h)
        return h

    # -- files -------------------------------------------------------------------------
    def save(self, directory: str | Path, meta: dict[str, Any] | None = None) -> Path:
        """Write ``policy.npz`` with this network and ``meta`` (default: its own)."""
        return _save_npz(directory, {"": self.layers}, self.meta if meta is None else meta)

    @classmethod
    def load(cls, path: str | Path) -> "QPolicy | SharedQPolicy":
        """Read a checkpoint (either architecture; see ``load_policy``)."""
        return load_policy(path)


def _save_npz(directory: str | Path, networks: dict[str, Sequence[tuple[np.ndarray, np.ndarray]]],
              meta: dict[str, Any]) -> Path:
    """Write ``policy.npz``: each network's layers as ``<prefix>w<i>``/``<prefix>b<i>``, plus ``meta``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    for prefix, layers in networks.items():
        for i, (w, b) in enumerate(layers):
            arrays[f"{prefix}w{i}"], arrays[f"{prefix}b{i}"] = w, b
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    path = d / POLICY_FILE
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def _mlp(x: np.ndarray, layers: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    last = len(layers) - 1
    for i, (w, b) in enumerate(layers):
        x = x @ w
        x += b
        if i < last:
            np.maximum(x, 0.0, out=x)
    return x


def _chain(layers: Sequence[tuple[np.ndarray, np.ndarray]], what: str) -> list:
    out = [(np.ascontiguousarray(w, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32))
           for w, b in layers]
    if not out:
        raise CheckpointError(f"policy: the {what} network has no layers")
    for (w0, _), (w1, _) in zip(out, out[1:]):
        if w0.shape[1] != w1.shape[0]:
            raise CheckpointError(f"policy: {what} layer shapes do not chain: {w0.shape} -> {w1.shape}")
    if out[-1][0].shape[1] != 1:
        raise CheckpointError(f"policy: the {what} network must end in one output")
    return out


class SharedQPolicy:
    """Permutation-equivariant Q-network over float32 numpy arrays.

    The observation is ``[head (head_dim)] + m x [instance (per_instance_dim)]``
    (``FeatureSpec``'s layout). ``Q_i = f([head, x_i, mean_j x_j])`` for every
    instance with one shared MLP ``f``, and ``Q_defer = g([head, mean_j x_j])``."""

    def __init__(self, instance_layers, defer_layers, meta: dict[str, Any]):
        net = meta.get("network") or {}
        try:
            self.head_dim = int(net["head_dim"])
            self.num_instances = int(net["num_instances"])
            self.per_instance_dim = int(net["per_instance_dim"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError("policy: a shared network needs head_dim, num_instances and "
                                  "per_instance_dim in its metadata") from None
        self.instance_layers = _chain(instance_layers, "instance")
        self.defer_layers = _chain(defer_layers, "defer")
        h, k = self.head_dim, self.per_instance_dim
        if self.instance_layers[0][0].shape[0] != h + 2 * k or self.defer_layers[0][0].shape[0] != h + k:
            raise CheckpointError("policy: shared network input widths do not fit its metadata")
        self.meta = meta
        self.obs_dim = h + self.num_instances * k
        self.num_actions = self.num_instances + 1

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        h, m, k = self.head_dim, self.num_instances, self.per_instance_dim
        head = obs[:h]
        inst = obs[h:h + m * k].reshape(m, k)
        pooled = inst.mean(axis=0)
        x = np.empty((m, h + 2 * k), np.float32)
        x[:, :h] = head
        x[:, h:h + k] = inst
        x[:, h + k:] = pooled
        q_inst = _mlp(x, self.instance_layers)[:, 0]
        q_defer = _mlp(np.concatenate([head, pooled])[None, :], self.defer_layers)[0]
        return np.concatenate([q_inst, q_defer])

    def save(self, directory: str | Path, meta: dict[str, Any] | None = None) -> Path:
        """Write ``policy.npz`` with this network and ``meta`` (default: its own)."""
        return _save_npz(directory, {"i": self.instance_layers, "d": self.defer_layers},
                         self.meta if meta is None else meta)


def load_policy(path: str | Path) -> QPolicy | SharedQPolicy:
    """Read ``policy.npz`` (a directory or the file) as whichever network it holds."""
    p = Path(path)
    if p.is_dir():
        p = p / POLICY_FILE
    if not p.is_file():
        raise CheckpointError(f"no {POLICY_FILE} at {path}", "checkpoint")

    def layers(z, prefix: str) -> list:
        n = sum(1 for k in z.files if k.startswith(f"{prefix}w"))
        return [(z[f"{prefix}w{i}"], z[f"{prefix}b{i}"]) for i in range(n)]

    try:
        with np.load(p, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            arch = (meta.get("network") or {}).get("arch", "mlp")
            if arch == "shared":
                return SharedQPolicy(layers(z, "i"), layers(z, "d"), meta)
            if arch != "mlp":
                raise CheckpointError(f"checkpoint: {p} holds an unknown network {arch!r}")
            weights = layers(z, "")
    except (OSError, KeyError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"checkpoint: {p} is not a policy file: {exc}") from None
    return QPolicy(weights, meta)


def workload_slug(workload: str | None) -> str:
    """Directory suffix for a workload label: ``trace:Azure_conv.csv`` -> ``azure_conv``."""
    if not workload:
        return ""
    name = workload.split(":", 1)[-1]
    name = Path(name).stem if workload.startswith(("trace:", "dataset:")) else name
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def shipped_checkpoint(variant: str, profile_name: str, num_instances: int,
                       workload: str | None = None, chunked_prefill: bool = False) -> Path:
    """The shipped checkpoint directory for a variant, profile, instance count
    and (when one was trained for it) workload and engine mode (``-chunked``:
    trained with chunked prefill on); ``CheckpointError`` naming what exists and
    how to train one when there is none. Lookup order: workload and engine mode,
    engine mode, workload, the general one."""
    base = f"{profile_name}-{num_instances}x"
    slug = workload_slug(workload)
    names = [f"{base}-{slug}", base] if slug else [base]
    if chunked_prefill:
        names = [n.replace(base, f"{base}-chunked", 1) for n in names] + names
    for name in names:
        d = SHIPPED_DIR / variant / name
        if (d / POLICY_FILE).is_file():
            return d
    have = sorted(p.parent.name for p in (SHIPPED_DIR / variant).glob(f"*/{POLICY_FILE}"))
    raise CheckpointError(
        f"router {variant}: no shipped checkpoint for profile {profile_name!r} with "
        f"{num_instances} instances (shipped: {', '.join(have) or 'none'}); train one with "
        f"`lbbench train --router {variant} --profile {profile_name} --instances {num_instances} "
        "[--trace FILE | --workload W] --predictor SPEC --out DIR` and pass --checkpoint DIR")


def _fleet_key(fleet: Any) -> str:
    """A fleet (``lbbench.fleet.Fleet`` or its spec) as a comparable spec string."""
    spec = fleet.spec() if hasattr(fleet, "spec") else str(fleet)
    return ",".join(part.strip() for part in spec.split(","))


def shipped_fleet_checkpoint(variant: str, fleet: Any, instance_scheduler: str | None = None) -> Path:
    """The shipped checkpoint trained on a mixed fleet (``config.json``'s ``fleet`` equal to the fleet's spec);
    ``CheckpointError`` naming the fleets that have one and how to train one when there is none. Where several
    were trained on the fleet, the one trained on the run's engine scheduler (``config.json``'s
    ``instance_scheduler``; None: ``fcfs``), else the FCFS one (which the scheduler guard then gates), else the
    first by name."""
    key = _fleet_key(fleet)
    have: list[str] = []
    found: list[tuple[str, Path]] = []  # (trained engine scheduler, directory), by name
    for cfg_path in sorted((SHIPPED_DIR / variant).glob("*/config.json")):
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, ValueError):
            continue
        trained = cfg.get("fleet")
        if trained:
            if trained not in have:
                have.append(trained)
            if _fleet_key(trained) == key and (cfg_path.parent / POLICY_FILE).is_file():
                found.append((str(cfg.get("instance_scheduler") or "fcfs"), cfg_path.parent))
    for want in (instance_scheduler or "fcfs", "fcfs"):
        for sched, where in found:
            if sched == want:
                return where
    if found:
        return found[0][1]
    raise CheckpointError(
        f"router {variant}: no shipped checkpoint for fleet {key!r} (shipped fleets: "
        f"{'; '.join(have) or 'none'}); train one with `lbbench train --router {variant} --fleet {key} "
        "--capacity-features --teacher least_work_speed --predictor SPEC --rate R --out DIR` and pass --checkpoint DIR")


class RLRouter:
    """Head-of-queue router driven by a Q-network (one of the three variants)."""

    variant = "wgrl"
    needs_detail = False

    def __init__(self, num_instances: int, seed: int = 0, profile: Any = None,
                 checkpoint: str | Path | None = None, workload: str | None = None,
                 ood_guard: bool = True, ood_margin: float = 0.05, gate: bool = True,
                 chunked_prefill: bool | None = None, instance_scheduler: str | None = None,
                 fleet: Any = None):
        profile_name = getattr(profile, "name", profile)
        if checkpoint is None and fleet is not None and not getattr(fleet, "is_uniform", False):
            # a mixed fleet (a Fleet or its spec): the checkpoint trained on that fleet
            checkpoint = shipped_fleet_checkpoint(self.variant, fleet, instance_scheduler)
        if checkpoint is None:
            if profile_name is None:
                raise CheckpointError(f"router {self.variant}: needs a profile or a checkpoint")
            chunked = getattr(profile, "chunked_prefill", False) if chunked_prefill is None else chunked_prefill
            checkpoint = shipped_checkpoint(self.variant, str(profile_name), num_instances, workload,
                                            bool(chunked))
        self.policy = load_policy(checkpoint)
        meta = self.policy.meta
        trained = meta.get("variant")
        if trained is not None and trained != self.variant:
            raise CheckpointError(f"checkpoint {checkpoint}: trained for {trained}, not {self.variant} "
                                  "(pass each RL router its own checkpoint)")
        if int(meta.get("num_instances", -1)) != num_instances:
            raise CheckpointError(
                f"checkpoint {checkpoint}: trained for {meta.get('num_instances')} instances, "
                f"the run has {num_instances}")
        self.spec = FeatureSpec.from_dict(meta["feature_spec"])
        self.featurize = Featurizer(self.spec)
        if self.policy.obs_dim != self.spec.obs_dim or self.policy.num_actions != num_instances + 1:
            raise CheckpointError(f"checkpoint {checkpoint}: network shape "
                                  f"{self.policy.obs_dim}->{self.policy.num_actions} does not fit "
                                  f"{num_instances} instances")
        self.max_defer_s = meta.get("max_defer_s")
        self._low = self._high = None
        if ood_guard and "obs_low" in meta and "obs_high" in meta:
            self._low = np.asarray(meta["obs_low"], np.float32) - ood_margin
            self._high = np.asarray(meta["obs_high"], np.float32) + ood_margin
            if self._low.shape != (self.spec.obs_dim,) or self._high.shape != (self.spec.obs_dim,):
                raise CheckpointError(f"checkpoint {checkpoint}: state range does not fit the network")
        mix = meta.get("mixing") or {}
        if mix:
            self.mixing = MixingParams(mix["grad1"], mix["grad2"], mix["epsilon"], mix["alpha"])
            self.estimator = mix.get("estimator", "paper")
        elif profile is not None and hasattr(profile, "grad1"):
            self.mixing, self.estimator = MixingParams.from_profile(profile), "paper"
        else:
            self.mixing = None
        self.prior_scale = float(meta.get("prior_scale") or 0.0)
        if self.prior_scale > 0 and self.mixing is None:
            raise CheckpointError(f"checkpoint {checkpoint}: a residual prior needs the mixing parameters")
        # the scheduler guard: a network learned its timing against one instance scheduler (a FIFO gate in front of
        # FCFS engines holds requests that vLLM's priority policy would have reordered), so on engines of another
        # scheduler the gate routes with the heuristic too
        trained_sched = (meta.get("trained_on") or {}).get("instance_scheduler")
        self.scheduler_mismatch = (None if instance_scheduler is None or trained_sched is None
                                   or instance_scheduler == trained_sched else (trained_sched, instance_scheduler))
        # a checkpoint trained with a deployable router as teacher (a capacity-aware heuristic, on a mixed fleet)
        # falls back to that router, not to the speed-blind mixing heuristic
        self.fallback = None
        if meta.get("fallback"):
            self.fallback = get_router(str(meta["fallback"]), num_instances=num_instances, seed=seed)
        self.heuristic_only = bool(gate and (self.mixing is not None or self.fallback is not None)
                                   and (meta.get("gate") == "heuristic" or self.scheduler_mismatch))
        self.num_fallbacks = 0
        self.num_decisions = 0
        self.num_instances = num_instances
        self.checkpoint = str(checkpoint)
        self.seed = seed
        self.name = self.variant

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.seed = seed
        if self.fallback is not None:
            self.fallback.reset(seed)

    def act(self, obs: np.ndarray, mask: np.ndarray, prior: Sequence[float] | None = None) -> int:
        """Greedy valid action for an observation (lowest index on ties), the
        network's values plus ``prior`` when given (residual Q)."""
        q = self.policy.q_values(obs)
        if prior is not None:
            q = q + np.asarray(prior, np.float32)
        return int(np.argmax(np.where(mask, q, -np.inf)))

    def in_distribution(self, obs: np.ndarray) -> bool:
        """Whether a state lies inside the (widened) range of the training states."""
        if self._low is None:
            return True
        return bool(np.all(obs >= self._low) and np.all(obs <= self._high))

    def queue_scores(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> list[float] | None:
        """Per instance, lower preferred (inf: masked): the network's Q-values negated (with the residual prior),
        or the guidance heuristic's penalties when it routes (a ``fallback`` router's own scores when that routes);
        read without changing the router."""
        if not queue:
            return None
        if self.fallback is not None and self.heuristic_only:  # the fallback router routes: its scores
            fb = getattr(self.fallback, "scores", None)
            return fb(queue[0], view) if fb is not None else None
        mask = action_mask(queue, view, now_s, self.max_defer_s)[:self.num_instances]
        pens = None
        if self.heuristic_only or self.mixing is not None or self.prior_scale > 0:
            pens = penalties(self.mixing, view, queue[0], self.estimator)
        if self.heuristic_only:
            vals = [float(p) for p in pens]
        else:
            obs = self.featurize(queue, view)
            q = np.asarray(self.policy.q_values(obs), np.float64)[:self.num_instances]
            if self.prior_scale > 0:
                q = q + np.asarray(heuristic_prior(pens, mask, self.prior_scale), np.float64)[:self.num_instances]
            vals = [float(-x) for x in q]
        return [v if ok else float("inf") for v, ok in zip(vals, mask)]

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        if not queue:
            return None
        self.num_decisions += 1
        mask = action_mask(queue, view, now_s, self.max_defer_s)
        if not mask[:self.num_instances].any():  # no healthy instance: the only valid action is to defer
            return None
        obs = None if self.heuristic_only else self.featurize(queue, view)
        if self.fallback is not None and (self.heuristic_only or not self.in_distribution(obs)):
            self.num_fallbacks += 1
            return self.fallback.route(queue, view, now_s)
        if self.heuristic_only or (self.mixing is not None and not self.in_distribution(obs)):
            self.num_fallbacks += 1
            pens = penalties(self.mixing, view, queue[0], self.estimator)
            return Decision(0, least_impact_instance(pens, np.flatnonzero(mask[:self.num_instances]).tolist()))
        prior = None
        if self.prior_scale > 0:  # residual Q: the network's values on top of the heuristic's prior
            prior = heuristic_prior(penalties(self.mixing, view, queue[0], self.estimator),
                                    mask[:self.num_instances], self.prior_scale)
        a = self.act(obs, mask, prior)
        return None if a == self.num_instances else Decision(0, a)


class BaselineRL(RLRouter):
    """Double-DQN router trained on the queue and completion terms only."""

    variant = "baseline_rl"


class WorkloadAwareRL(RLRouter):
    """Double-DQN router with the mixing penalty as a constant-weight reward term."""

    variant = "wa_rl"


class WorkloadGuidedRL(RLRouter):
    """Double-DQN router with the mixing penalty as annealed guidance (the paper's router)."""

    variant = "wgrl"


ROUTER_CLASSES = {c.variant: c for c in (BaselineRL, WorkloadAwareRL, WorkloadGuidedRL)}
