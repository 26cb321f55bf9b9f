"""Workload impact estimator: the paper's mixing penalty, as pure functions.

Jain et al. observe that on a continuously batched instance the end-to-end
latency of a request grows about linearly with the prompt tokens and the
decode tokens of the requests it is batched with: ``grad1`` seconds per
co-running prompt token (prefill stalls every decode step it shares) and
``grad2`` seconds per co-running decode token (3.2e-4 and 3.3e-5 s/token for
Llama-2-7B on a V100). Putting a request on an instance therefore costs more
than its own service time: it slows the requests already there, and they slow
it. This module estimates that cross-interference from numbers a router can
see (``lbbench.core.InstanceView``) and the request's prompt and *predicted*
decode length.

For an instance with ``n`` outstanding requests whose prompt tokens still to
prefill sum to ``P`` and whose predicted remaining decode tokens sum to ``D``,
and a new request with ``p`` prompt tokens and ``d`` predicted decode tokens:

* prefill interference ``I_p = grad1 * (n*p + P)``: the new prompt stalls each
  of the ``n`` co-runners while it is prefilled, and the prompts still pending
  there stall the new request;
* decode interference ``I_d = grad2 * 2 * min(n*d, D)``: the new request shares
  at most ``min(d, D_j)`` decode steps with co-runner ``j``; summed over the
  co-runners this is at most ``min(n*d, D)`` shared tokens, and each shared
  step slows both sides (hence the factor 2);
* impact ``I = alpha * I_p + (1 - alpha) * I_d`` seconds of added latency
  summed over the requests involved; ``alpha`` weighs prefill against decode
  interference (the paper uses 0.5);
* the mixing penalty is ``r_mixing = I`` when ``I >= epsilon`` and ``0``
  otherwise: impacts below the profile's threshold ``epsilon`` (seconds) are
  noise the router should ignore.

The RL reward uses the *guidance gap* ``h = r_mixing(chosen) - min_i
r_mixing(i)`` (>= 0, and 0 when the choice has the least impact). The paper
writes the same quantity with the penalty's sign flipped (a mixing *score*
``-r_mixing``, ``h = max_i score(i) - score(chosen)``); both read "how much worse
than the least-impact instance".

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


def instance_penalty(params: MixingParams, instance: InstanceView, prompt_tokens: int,
                     decode_tokens: int) -> float:
    """``r_mixing`` for one instance of a ``ClusterView``."""
    return r_mixing(params, num_running=instance.num_outstanding,
                    pending_prompt_tokens=instance.prompt_tokens_pending,
                    remaining_decode_tokens=instance.predicted_tokens_remaining,
                    prompt_tokens=prompt_tokens, decode_tokens=decode_tokens)


def penalties(params: MixingParams, view: ClusterView, request: Request) -> list[float]:
    """``r_mixing`` of ``request`` on every instance (predicted decode length
    when the request carries one, else its true length)."""
    d = request.expected_output_tokens
    p = request.prompt_tokens
    return [instance_penalty(params, iv, p, d) for iv in view.instances]


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
