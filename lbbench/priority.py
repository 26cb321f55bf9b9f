"""Request priorities for vLLM's priority scheduling policy (``--scheduling-policy priority``).

vLLM orders its waiting queue by ``(priority, arrival)`` (smaller first) and, when
the KV cache runs out, preempts the running request with the largest
``(priority, arrival)`` instead of the newest. lbbench gives every request the
same priority in the simulator (``--instance-scheduler priority``) and on the
wire (the ``priority`` field of a live request): its predicted work, the prefill
plus predicted decode time at the profile's minimum step, in whole
milliseconds (vLLM's priority is an integer).

It sits beside ``core`` because both the simulated engine (``sim.instance``) and the live backend read it, and
the Min-Min heuristics share its job-time estimate: none of them should import the others' packages for it.
"""

from __future__ import annotations

from .core import Request
from .profiles import Profile


def job_time_s(request: Request, profile: Profile | None) -> float:
    """Serial service-time estimate: prefill + predicted decode at the minimum step."""
    if profile is None:
        return float(request.prompt_tokens * 2e-4 + request.expected_output_tokens * 0.02)
    return (request.prompt_tokens * profile.prefill_token_s
            + request.expected_output_tokens * profile.min_step_s)


def request_priority(request: Request, profile: Profile | None) -> int:
    """The request's priority: predicted work in milliseconds (smaller is served first)."""
    return int(round(1000.0 * job_time_s(request, profile)))
