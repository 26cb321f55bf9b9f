"""Teachers for the RL routers: plain functions ``sim -> action`` in the paper's action space.

A teacher looks at the simulator the environment drives (``ClusterSim``) and
returns the action for the head of the router queue: ``i < m`` routes it to
instance ``i``, ``m`` defers. The training loop can imitate one (behaviour
cloning, then DAgger: the learner's states labelled with the teacher's
actions) or use it as the guidance heuristic ``h`` (``--guidance``). A teacher
may read oracle information (true output lengths, future arrivals); the
network it teaches never does: its observation is built from predicted lengths
only (``lbbench.routers.rl.features``).

- ``kv_gate`` (oracle lengths): the FIFO KV gate of ``late_binding_srpt`` with
  ``order=fcfs``, ``kv_slack=0``, reduced to the head of the queue. An
  instance is open when it has a free sequence slot and less than one engine
  step of prompt tokens waiting; the head fits there when the projected peak
  KV of the instance's outstanding requests plus the head, each at its *true*
  final length, stays within the KV capacity (an idle instance always fits).
  The head goes to the open instance where the largest prompt would still fit
  beside it (the most free projected KV), else it waits. Once it has waited
  ``max_defer_s`` it goes to that instance regardless.
- ``lookahead``: the oracle planner (``lbbench.routers.lookahead.plan_action``),
  head of the queue only.
- ``least_work_speed``, ``jsq_speed`` (``ROUTER_TEACHERS``): the capacity-aware
  heuristics of ``lbbench.routers.capacity``, for mixed fleets. The ``kv_gate``
  teacher sizes each instance by its own KV capacity but is blind to speed: on
  an A100 + L4 fleet its "most free KV" rule sends work to whichever cache is
  emptiest, not to whichever instance finishes it first. These read only
  predicted lengths and the instances' specs (deployable), never defer while an
  instance is up, and are reset at the start of every episode (their
  round-robin tie-break) so an episode's labels do not depend on the worker.

``TeacherRouter`` wraps the ``kv_gate`` teacher as a router (so validation can
score the teacher like any router).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from lbbench.core import ClusterView, Decision, Request
from lbbench.routers.late_binding import KvGate, clamp_output
from lbbench.routers.lookahead import plan_action
from lbbench.routers.registry import get_router
from lbbench.sim.cluster import ClusterSim

#: teachers that are routers of the registry: deployable, capacity-aware (for mixed fleets)
ROUTER_TEACHERS = ("least_work_speed", "jsq_speed")
TEACHERS = ("none", "kv_gate", "lookahead", *ROUTER_TEACHERS)
GUIDANCES = ("mixing", "kv_gate", "lookahead", *ROUTER_TEACHERS)

Teacher = Callable[[ClusterSim], int]


def kv_gate_action(queue: Sequence[Request], view: ClusterView, now_s: float, *,
                   max_num_batched_tokens: int, max_defer_s: float | None = None,
                   kv_slack: float = 0.0, overrun_tokens: int = 32, oracle: bool = True) -> int:
    """The ``kv_gate`` teacher's action for the head of ``queue`` (``view`` with
    detail): true output lengths, or with ``oracle=False`` the predicted ones
    (``Request.expected_output_tokens``: the same gate on the deployable signal)."""
    m = view.num_instances
    if not queue:
        return m
    head = queue[0]
    length = (lambda r: r.output_tokens) if oracle else (lambda r: r.expected_output_tokens)
    healthy = [iv for iv in view.instances if iv.healthy]
    if not healthy:
        return m
    best, best_room = None, -math.inf
    for iv in healthy:
        if iv.num_outstanding and (iv.num_outstanding >= iv.spec.max_num_seqs
                                   or iv.prompt_tokens_pending >= max_num_batched_tokens):
            continue
        cap = float(iv.spec.kv_capacity_tokens)
        gate = KvGate(iv, cap, cap * (1.0 + kv_slack), length, overrun_tokens)
        d = clamp_output(length(head), head.prompt_tokens, cap)
        room = math.inf if gate.idle else gate.max_prompt_tokens(d) - head.prompt_tokens
        if room >= 0 and room > best_room:
            best, best_room = iv.index, room
    if best is not None:
        return best
    if max_defer_s is not None and now_s - head.arrival_s >= max_defer_s:
        # the defer guard: route now, to the instance with the least projected footprint
        return min(healthy, key=lambda iv: (iv.predicted_footprint_tokens, iv.index)).index
    return m


def make_teacher(name: str, profile, *, max_defer_s: float | None = None,
                 horizon_s: float | None = None) -> Teacher | None:
    """The teacher ``name`` names (``None`` for ``none``); ``ValueError`` naming the
    setting for an unknown one or a planner that is not available."""
    if name == "none":
        return None
    if name == "kv_gate":
        budget = int(profile.max_num_batched_tokens)

        def kv_gate(sim: ClusterSim) -> int:
            return kv_gate_action(sim.queue, sim.view(detail=True), sim.now_s,
                                  max_num_batched_tokens=budget, max_defer_s=max_defer_s)
        return kv_gate
    if name == "lookahead":
        kw = {} if horizon_s is None else {"horizon_s": horizon_s}

        def lookahead(sim: ClusterSim) -> int:
            d = plan_action(sim, reorder=False, **kw)
            return sim.num_instances if d is None else int(d.instance)
        return lookahead
    if name in ROUTER_TEACHERS:
        router = get_router(name, num_instances=0, profile=profile)
        last: list = [None]

        def heuristic(sim: ClusterSim) -> int:
            if sim is not last[0]:  # a new episode
                router.reset()
                last[0] = sim
            d = router.route(sim.queue, sim.view(), sim.now_s) if sim.queue else None
            return sim.num_instances if d is None else int(d.instance)
        heuristic.__name__ = name
        return heuristic
    raise ValueError(f"teacher: {name!r} is not one of {', '.join(TEACHERS)}")


class TeacherRouter:
    """The ``kv_gate`` teacher as a router (an oracle: it reads true output lengths;
    with ``oracle=False`` the same gate on predicted lengths, deployable)."""

    needs_detail = True
    name = "kv_gate_teacher"

    def __init__(self, num_instances: int, profile, max_defer_s: float | None = None, oracle: bool = True):
        self.num_instances = num_instances
        self.budget = int(profile.max_num_batched_tokens)
        self.max_defer_s = max_defer_s
        self.oracle = oracle

    def route(self, queue: Sequence[Request], view: ClusterView, now_s: float) -> Decision | None:
        a = kv_gate_action(queue, view, now_s, max_num_batched_tokens=self.budget,
                           max_defer_s=self.max_defer_s, oracle=self.oracle)
        return None if a >= self.num_instances else Decision(0, a)
