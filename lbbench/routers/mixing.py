"""Workload impact estimator: the paper's mixing reward, as pure functions.

Jain et al. (arXiv 2408.13510, Sec. 4) observe that on a continuously batched
instance the end-to-end latency of a request grows about linearly with the
tokens of the requests it is batched with: ``grad1`` seconds per prompt token
and ``grad2`` seconds per decode token (3.2e-4 and 3.3e-5 for Llama-2-7B on a
V100). Putting request ``i`` (prompt ``p_i`` tokens, *predicted* decode ``d_i``
tokens) on an instance whose requests ``j`` hold ``p_j`` prompt and ``d_j``
generated tokens costs, in the paper's form (the default, ``estimator="paper"``):

* ``T_p = grad1 * (p_i**2 + Σ_j (p_j + d_j))`` — the prefill time estimate;
  ``Σ_j (p_j + d_j)`` is the KV the instance holds (``kv_tokens_held``: the
  context of its decoding requests plus the prompts it still has to prefill);
* ``r_p = 1 - T_p / epsilon`` when ``T_p > epsilon``, else ``0`` — the prefill
  reward, zero while the prefill stays under the threshold ``epsilon``;
* ``r_d = -grad2 * (Σ_j (p_j + d_j) + p_i + d_i)`` — the decode reward;
* ``r_mix = alpha * r_p + (1 - alpha) * r_d`` (``alpha = 0.5`` in the paper).

``r_mix <= 0``; the *mixing penalty* is ``-r_mix >= 0`` (larger is worse), and
the guidance of the RL router is the gap ``h = max_i r_mix(i) - r_mix(chosen)``
(``guidance_gap`` on the penalties: "how much worse than the least-impact
instance"; 0 when the choice is the best).

``estimator="interference"`` keeps lbbench's earlier cross-interference
estimate as a named option: for ``n`` outstanding requests with ``P`` prompt
tokens still to prefill and ``D`` predicted decode tokens left, ``I_p = grad1 *
(n*p + P)``, ``I_d = grad2 * 2 * min(n*d, D)``, ``I = alpha*I_p + (1-alpha)*I_d``
seconds, counted when ``I >= epsilon``. It ignores the KV held.

Everything here is a pure function of floats/ints, so heuristic routers and the
RL environment share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from lbbench.core import ClusterView, InstanceView, Request


@dataclass(frozen=True, slots=True)
class MixingParams:
    """The estimator's parameters (all from a profile's ``[mixing]`` table)."""

    grad1: float  #: seconds of added latency per co-running prompt token
    grad2: float  #: seconds of added latency per co-running decode token
    epsilon: float  #: impacts below this many seconds count as zero
    alpha: float = 0.5  #: weight of prefill (vs decode) interference, 0..1

    def __post_init__(self) -> None:
        if self.grad1 < 0 or self.grad2 < 0 or self.epsilon < 0:
            raise ValueError("mixing: grad1, grad2 and epsilon must be >= 0")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"mixing: alpha must be in [0, 1], got {self.alpha}")

    @classmethod
    def from_profile(cls, profile) -> "MixingParams":
        """Build from anything with ``grad1/grad2/epsilon/alpha`` attributes
        (a ``lbbench.profiles.Profile``)."""
        return cls(float(profile.grad1), float(profile.grad2), float(profile.epsilon),
                   float(profile.alpha))


def prefill_interference_s(params: MixingParams, num_running: int, pending_prompt_tokens: int,
                           prompt_tokens: int) -> float:
    """``grad1 * (n*p + P)``: see the module docstring."""
    return params.grad1 * (num_running * prompt_tokens + pending_prompt_tokens)


def decode_interference_s(params: MixingParams, num_running: int, remaining_decode_tokens: int,
                          decode_tokens: int) -> float:
    """``grad2 * 2 * min(n*d, D)``: see the module docstring."""
    shared = min(num_running * decode_tokens, max(0, remaining_decode_tokens))
    return params.grad2 * 2.0 * shared


def mixing_impact_s(params: MixingParams, *, num_running: int, pending_prompt_tokens: int,
                    remaining_decode_tokens: int, prompt_tokens: int, decode_tokens: int) -> float:
    """Estimated added latency (s) of putting a ``(prompt_tokens,
    decode_tokens)`` request on an instance with the given running mix, before
    the ``epsilon`` threshold."""
    if num_running <= 0:
        return 0.0
    a = params.alpha
    return (a * prefill_interference_s(params, num_running, pending_prompt_tokens, prompt_tokens)
            + (1.0 - a) * decode_interference_s(params, num_running, remaining_decode_tokens,
                                                decode_tokens))


def r_mixing(params: MixingParams, *, num_running: int, pending_prompt_tokens: int,
             remaining_decode_tokens: int, prompt_tokens: int, decode_tokens: int) -> float:
    """The mixing penalty: the impact when it reaches ``epsilon``, else 0."""
    impact = mixing_impact_s(params, num_running=num_running,
                             pending_prompt_tokens=pending_prompt_tokens,
                             remaining_decode_tokens=remaining_decode_tokens,
                             prompt_tokens=prompt_tokens, decode_tokens=decode_tokens)
    return impact if impact >= params.epsilon else 0.0


def paper_prefill_time_s(params: MixingParams, prompt_tokens: int, held_tokens: int) -> float:
    """The paper's ``T_p = grad1 * (p_i**2 + Σ_j (p_j + d_j))``."""
    return params.grad1 * (prompt_tokens * prompt_tokens + held_tokens)


def paper_prefill_reward(params: MixingParams, prefill_time_s: float) -> float:
    """The paper's ``r_p``: ``1 - T_p / epsilon`` above ``epsilon``, else 0 (with
    ``epsilon = 0`` there is no threshold to scale by: ``r_p = -T_p``)."""
    if params.epsilon <= 0.0:
        return -prefill_time_s
    if prefill_time_s > params.epsilon:
        return 1.0 - prefill_time_s / params.epsilon
    return 0.0


def paper_decode_reward(params: MixingParams, held_tokens: int, prompt_tokens: int,
                        decode_tokens: int) -> float:
    """The paper's ``r_d = -grad2 * (Σ_j (p_j + d_j) + p_i + d_i)``."""
    return -params.grad2 * (held_tokens + prompt_tokens + decode_tokens)


def paper_r_mix(params: MixingParams, *, held_tokens: int, prompt_tokens: int,
                decode_tokens: int) -> float:
    """The paper's ``r_mix = alpha * r_p + (1 - alpha) * r_d`` (always <= 0)."""
    t_p = paper_prefill_time_s(params, prompt_tokens, held_tokens)
    a = params.alpha
    return (a * paper_prefill_reward(params, t_p)
            + (1.0 - a) * paper_decode_reward(params, held_tokens, prompt_tokens, decode_tokens))


def kv_tokens_held(instance: InstanceView) -> int:
    """``Σ_j (p_j + d_j)`` over an instance's outstanding requests: the context of
    its decoding requests plus the prompts it has still to (re)fill."""
    return int(instance.context_tokens) + int(instance.prompt_tokens_pending)


ESTIMATORS = ("paper", "interference")


def instance_penalty(params: MixingParams, instance: InstanceView, prompt_tokens: int,
                     decode_tokens: int, estimator: str = "paper") -> float:
    """The mixing penalty (>= 0, larger is worse) of one instance of a
    ``ClusterView``: ``-r_mix`` (``estimator="paper"``) or the interference
    estimate ``r_mixing`` (``estimator="interference"``)."""
    if estimator == "paper":
        return -paper_r_mix(params, held_tokens=kv_tokens_held(instance),
                            prompt_tokens=prompt_tokens, decode_tokens=decode_tokens)
    if estimator != "interference":
        raise ValueError(f"mixing: unknown estimator {estimator!r} (choose from {', '.join(ESTIMATORS)})")
    return r_mixing(params, num_running=instance.num_outstanding,
                    pending_prompt_tokens=instance.prompt_tokens_pending,
                    remaining_decode_tokens=instance.predicted_tokens_remaining,
                    prompt_tokens=prompt_tokens, decode_tokens=decode_tokens)


def penalties(params: MixingParams, view: ClusterView, request: Request,
              estimator: str = "paper") -> list[float]:
    """The mixing penalty of ``request`` on every instance (predicted decode
    length when the request carries one, else its true length)."""
    d = request.expected_output_tokens
    p = request.prompt_tokens
    return [instance_penalty(params, iv, p, d, estimator) for iv in view.instances]


def guidance_gap(penalty_by_instance: Sequence[float], chosen: int,
                 candidates: Sequence[int] | None = None) -> float:
    """``h``: how much more mixing impact the chosen instance has than the
    least-impact one among ``candidates`` (default: all). Always >= 0."""
    idx = range(len(penalty_by_instance)) if candidates is None else candidates
    best = min(penalty_by_instance[i] for i in idx)
    return max(0.0, penalty_by_instance[chosen] - best)


def least_impact_instance(penalty_by_instance: Sequence[float],
                          candidates: Sequence[int] | None = None) -> int:
    """Index with the smallest penalty (lowest index on ties)."""
    idx = range(len(penalty_by_instance)) if candidates is None else candidates
    return min(idx, key=lambda i: (penalty_by_instance[i], i))


def heuristic_prior(penalty_by_instance: Sequence[float], valid: Sequence[bool], scale: float) -> list[float]:
    """Residual-Q prior over the actions ``[instance 0..m-1, defer]``: ``-scale``
    times each instance's guidance gap relative to the largest gap among the valid
    instances (0 for the least-impact instance, ``-scale`` for the worst), and
    ``-scale`` for defer. A network whose own values are flat thus acts as the
    heuristic; it departs from it only where it has learned a larger difference."""
    m = len(penalty_by_instance)
    idx = [i for i in range(m) if valid[i]]
    out = [-scale] * (m + 1)
    if not idx:
        return out
    best = min(penalty_by_instance[i] for i in idx)
    worst = max(penalty_by_instance[i] for i in idx)
    span = worst - best
    for i in idx:
        out[i] = 0.0 if span <= 0 else -scale * (penalty_by_instance[i] - best) / span
    return out
