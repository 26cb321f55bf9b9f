"""The RL router's state vector, built from what any router can see.

Following the paper, the observation at a decision epoch is made of

* the router queue length, divided by ``4 * max_num_seqs`` and capped at 1;
* the head request's prompt length (``log1p`` scaled by the model's context
  limit) and its predicted decode bucket (one-hot; all zeros when the queue is
  empty);
* per instance: the number of outstanding requests in each prompt bucket and in
  each decode bucket (``InstanceView.prompt_bucket_counts`` /
  ``decode_bucket_counts``, divided by ``max_num_seqs``), a capacity figure
  ``1 - num_outstanding / max_num_seqs`` clipped to [-1, 1] (negative when the
  instance already queues requests of its own), the estimated time to its
  earliest completion ``min_remaining_tokens * min_step_s`` (divided by
  ``completion_horizon_s`` and capped at 1; 0 when nothing decodes), and, beyond
  the paper, the instance's outstanding work (prompt tokens still to prefill
  plus predicted decode tokens left, ``log1p``-scaled by
  ``max_num_seqs * max_model_len``: under overload the counts saturate long
  before the work does) and whether it is healthy.

With ``kv_features`` (a deviation, off in the paper's formulation and in older
checkpoints) the state also carries what a KV-footprint gate looks at, from
*predicted* lengths only: the head's predicted footprint (prompt + predicted
output) and, per instance, the predicted final footprint of its outstanding
requests, the KV its running requests hold now, and whether the head would fit
beside them (``(capacity - footprint - head footprint) / capacity``), each as a
fraction of the instance's KV capacity. Nothing in it is an oracle quantity.

With ``capacity_features`` (a deviation for mixed fleets, off by default and in
every older checkpoint) each instance also carries what its ``InstanceSpec``
says about its capacity (deployable: the instance's profile or a measurement,
never the simulator): its decode and prefill throughput
(``batch_decode_tokens_per_s``, ``prefill_tokens_per_s``) relative to the
fleet's fastest, its KV capacity relative to the largest, and its expected
drain time, the prompt tokens it still has to prefill at its own prefill rate
plus the predicted decode tokens left at its own decode rate
(``lbbench.routers.capacity.drain_time_s``), ``log1p``-scaled by
``drain_horizon_s``. With them the per-instance counts and KV figures are
fractions of the instance's *own* ``max_num_seqs`` and KV capacity (an L4's
cache fills long before an A100's), not of the spec's.

Everything is a float32 numpy vector of fixed length ``FeatureSpec.obs_dim``;
one call costs a few microseconds (a Python list filled in one pass, one
``np.asarray``). No torch, no simulator imports: the same code serves the
Gymnasium environment, the simulator and the live harness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from lbbench.core import DEFAULT_STATE_BUCKETS, ClusterView, Request, bucket_of
from lbbench.routers.capacity import drain_time_s

#: per-instance features: prompt buckets + decode buckets + these
_PER_INSTANCE_EXTRA = ("capacity", "earliest_completion", "work", "healthy")
#: with ``kv_features``: per instance, after the extras above; the head gets ``head_kv``
_PER_INSTANCE_KV = ("kv_footprint", "kv_held", "kv_fit")
#: with ``capacity_features``: per instance, last
_PER_INSTANCE_CAPACITY = ("decode_speed", "prefill_speed", "kv_capacity", "drain_time")


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """Shapes and scales of the observation (saved with every checkpoint)."""

    num_instances: int
    max_num_seqs: int
    min_step_s: float
    max_model_len: int
    kv_capacity_tokens: int
    prompt_buckets: tuple[int, ...] = DEFAULT_STATE_BUCKETS
    decode_buckets: tuple[int, ...] = DEFAULT_STATE_BUCKETS
    completion_horizon_s: float = 10.0
    count_cap: float = 4.0  #: bucket counts are clipped at this many max_num_seqs
    kv_features: bool = False  #: add the predicted-KV-footprint features (see the module docstring)
    capacity_features: bool = False  #: add each instance's relative speed, KV capacity and drain time
    drain_horizon_s: float = 600.0  #: drain_time is log1p(drain_s) / log1p(drain_horizon_s), capped at 2

    @classmethod
    def from_profile(cls, profile, num_instances: int, **kw) -> "FeatureSpec":
        return cls(num_instances=num_instances, max_num_seqs=int(profile.max_num_seqs),
                   min_step_s=float(profile.min_step_s), max_model_len=int(profile.max_model_len),
                   kv_capacity_tokens=int(profile.kv_capacity_tokens), **kw)

    @classmethod
    def from_profiles(cls, profiles, **kw) -> "FeatureSpec":
        """The spec of a fleet, one profile per instance: one profile's spec when they are all the same
        (a uniform fleet), else the fleet's largest ``max_num_seqs`` and KV capacity, shortest
        ``min_step_s`` (the dispatcher's Δt) and shortest context limit."""
        profiles = list(profiles)
        if all(p == profiles[0] for p in profiles[1:]):
            return cls.from_profile(profiles[0], len(profiles), **kw)
        return cls(num_instances=len(profiles), max_num_seqs=max(int(p.max_num_seqs) for p in profiles),
                   min_step_s=min(float(p.min_step_s) for p in profiles),
                   max_model_len=min(int(p.max_model_len) for p in profiles),
                   kv_capacity_tokens=max(int(p.kv_capacity_tokens) for p in profiles), **kw)

    @property
    def num_prompt_buckets(self) -> int:
        return len(self.prompt_buckets) + 1

    @property
    def num_decode_buckets(self) -> int:
        return len(self.decode_buckets) + 1

    @property
    def per_instance_dim(self) -> int:
        return (self.num_prompt_buckets + self.num_decode_buckets + len(_PER_INSTANCE_EXTRA)
                + (len(_PER_INSTANCE_KV) if self.kv_features else 0)
                + (len(_PER_INSTANCE_CAPACITY) if self.capacity_features else 0))

    @property
    def head_dim(self) -> int:
        return 2 + self.num_decode_buckets + (1 if self.kv_features else 0)

    @property
    def obs_dim(self) -> int:
        return self.head_dim + self.num_instances * self.per_instance_dim

    def names(self) -> list[str]:
        """Feature names, in vector order (for debugging and the README)."""
        out = ["queue_len", "head_prompt"] + [f"head_decode_b{b}" for b in range(self.num_decode_buckets)]
        if self.kv_features:
            out.append("head_kv")
        for i in range(self.num_instances):
            out += [f"i{i}_prompt_b{b}" for b in range(self.num_prompt_buckets)]
            out += [f"i{i}_decode_b{b}" for b in range(self.num_decode_buckets)]
            out += [f"i{i}_{n}" for n in _PER_INSTANCE_EXTRA]
            if self.kv_features:
                out += [f"i{i}_{n}" for n in _PER_INSTANCE_KV]
            if self.capacity_features:
                out += [f"i{i}_{n}" for n in _PER_INSTANCE_CAPACITY]
        return out

    def as_dict(self) -> dict:
        d = self._as_dict()
        if self.kv_features:  # older checkpoints have no such key (and no such features)
            d["kv_features"] = True
        if self.capacity_features:  # likewise
            d["capacity_features"] = True
            d["drain_horizon_s"] = self.drain_horizon_s
        return d

    def _as_dict(self) -> dict:
        return {"num_instances": self.num_instances, "max_num_seqs": self.max_num_seqs,
                "min_step_s": self.min_step_s, "max_model_len": self.max_model_len,
                "kv_capacity_tokens": self.kv_capacity_tokens,
                "prompt_buckets": list(self.prompt_buckets),
                "decode_buckets": list(self.decode_buckets),
                "completion_horizon_s": self.completion_horizon_s, "count_cap": self.count_cap}

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureSpec":
        d = dict(d)
        d["prompt_buckets"] = tuple(d["prompt_buckets"])
        d["decode_buckets"] = tuple(d["decode_buckets"])
        return cls(**d)


class Featurizer:
    """Turns ``(queue, view)`` into the observation vector for one spec."""

    __slots__ = ("spec", "_inv_seqs", "_queue_scale", "_prompt_scale", "_inv_horizon",
                 "_work_scale", "_cap", "_ndb", "_zeros_db", "_kv", "_inv_kv", "_capf", "_drain_scale")

    def __init__(self, spec: FeatureSpec):
        self.spec = spec
        self._inv_seqs = 1.0 / spec.max_num_seqs
        self._queue_scale = 1.0 / (4 * spec.max_num_seqs)
        self._prompt_scale = 1.0 / math.log1p(spec.max_model_len)
        self._inv_horizon = spec.min_step_s / spec.completion_horizon_s
        self._work_scale = 1.0 / math.log1p(spec.max_num_seqs * spec.max_model_len)
        self._cap = spec.count_cap
        self._ndb = spec.num_decode_buckets
        self._zeros_db = [0.0] * self._ndb
        self._kv = spec.kv_features
        self._inv_kv = 1.0 / max(1, spec.kv_capacity_tokens)
        self._capf = spec.capacity_features
        self._drain_scale = 1.0 / math.log1p(spec.drain_horizon_s)

    def __call__(self, queue: Sequence[Request], view: ClusterView) -> np.ndarray:
        spec = self.spec
        if view.num_instances != spec.num_instances:
            raise ValueError(f"features: view has {view.num_instances} instances, the policy was "
                             f"built for {spec.num_instances}")
        n = len(queue)
        out = [min(1.0, n * self._queue_scale)]
        head_kv = head_tokens = 0.0
        if n:
            head = queue[0]
            out.append(min(1.0, math.log1p(head.prompt_tokens) * self._prompt_scale))
            onehot = list(self._zeros_db)
            onehot[bucket_of(head.expected_output_tokens, spec.decode_buckets)] = 1.0
            out += onehot
            head_tokens = float(head.prompt_tokens + head.expected_output_tokens)
            head_kv = head_tokens * self._inv_kv
        else:
            out.append(0.0)
            out += self._zeros_db
        kv, inv_kv = self._kv, self._inv_kv
        capf = self._capf
        if kv:
            out.append(min(2.0, head_kv))
        inv, cap = self._inv_seqs, self._cap
        if capf:  # the fleet's fastest and largest, from the instances' specs
            specs = [iv.spec for iv in view.instances]
            inv_dec = 1.0 / max(s.batch_decode_tokens_per_s for s in specs)
            inv_pre = 1.0 / max(s.prefill_tokens_per_s for s in specs)
            inv_kvmax = 1.0 / max(s.kv_capacity_tokens for s in specs)
        for iv in view.instances:
            if capf:  # counts and KV as fractions of the instance's own limits
                sp = iv.spec
                inv = 1.0 / sp.max_num_seqs
                inv_kv = 1.0 / max(1, sp.kv_capacity_tokens)
                head_kv = head_tokens * inv_kv
            for c in iv.prompt_bucket_counts:
                out.append(min(cap, c * inv))
            for c in iv.decode_bucket_counts:
                out.append(min(cap, c * inv))
            out.append(max(-1.0, 1.0 - iv.num_outstanding * inv))
            mr = iv.min_remaining_tokens
            out.append(0.0 if mr is None else min(1.0, max(0, mr) * self._inv_horizon))
            out.append(min(2.0, math.log1p(iv.work_tokens) * self._work_scale))
            out.append(1.0 if iv.healthy else 0.0)
            if kv:
                foot = iv.predicted_footprint_tokens * inv_kv
                out.append(min(4.0, foot))
                out.append(min(2.0, iv.context_tokens * inv_kv))
                out.append(max(-2.0, min(1.0, 1.0 - foot - head_kv)))
            if capf:
                out.append(sp.batch_decode_tokens_per_s * inv_dec)
                out.append(sp.prefill_tokens_per_s * inv_pre)
                out.append(sp.kv_capacity_tokens * inv_kvmax)
                out.append(min(2.0, math.log1p(drain_time_s(iv)) * self._drain_scale))
        if len(out) != spec.obs_dim:
            raise ValueError(f"features: got {len(out)} values, expected {spec.obs_dim} (bucket "
                             "edges of the cluster state and the policy differ?)")
        return np.asarray(out, dtype=np.float32)


def action_mask(queue: Sequence[Request], view: ClusterView, now_s: float,
                max_defer_s: float | None = None) -> np.ndarray:
    """Valid actions (bool, length ``m + 1``): route the head to a healthy
    instance, or defer (action ``m``). With an empty queue only deferring is
    valid; once the head has waited ``max_defer_s`` deferring is no longer
    allowed (a guard against a policy that would hold a request forever)."""
    m = view.num_instances
    mask = np.zeros(m + 1, dtype=bool)
    if not queue:
        mask[m] = True
        return mask
    for iv in view.instances:
        mask[iv.index] = iv.healthy
    if not mask[:m].any():
        mask[m] = True
    else:
        mask[m] = max_defer_s is None or now_s - queue[0].arrival_s < max_defer_s
    return mask
