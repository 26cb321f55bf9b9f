"""Cheap copies of a running simulator: ``fork(sim)`` returns an independent ``ClusterSim``.

A planner rolls many alternative futures forward from the same decision epoch. Each needs its own copy of
everything the future mutates, and nothing else:

- per instance: the waiting queue, the running list, every engine-side request (``SimRequest``, copied once
  and shared between the containers that name it, as in the original), the finish heap, the step-end log,
  the segment in progress, the loads from the CPU tier in flight, and its KV block manager (counts, decode
  histogram, the prefix cache and the CPU tier when there are);
- the cluster: the event heap, the arrival cursor, the per-instance wake versions, dispatch times, pending
  session turns, counters, the records and completions so far;
- the dispatcher's queue and the client-side ``ClusterState`` (its per-request entries included).

What never changes is shared, not copied: the profiles (one per instance), the ``Request`` objects (immutable), the workload's
request list, finished records. A fork costs time proportional to the requests in the system, not to the
episode; ``copy.deepcopy`` would copy the profile, every request and every record as well.

Attributes are copied generically (a shallow copy of each container, numpy arrays copied) with the
containers that hold engine-side requests remapped, so an attribute added to ``SimInstance`` or
``ClusterSim`` later is still separated as long as it is a plain container of plain values; the clone test
(``tests/routers/test_lookahead.py``) runs a fork and its original to completion and compares every record.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core import ClusterState, _Entry, _Instance
from ..dispatch import Dispatcher
from .block_manager import KVBlockManager
from .instance import SimInstance, SimRequest

if TYPE_CHECKING:
    from .cluster import ClusterSim

_REQ_SLOTS = SimRequest.__slots__
_LIST_SLOTS = ("ranges", "held", "extra_times")


def _copy_request(r: SimRequest) -> SimRequest:
    n = SimRequest.__new__(SimRequest)
    for s in _REQ_SLOTS:
        setattr(n, s, getattr(r, s))
    for s in _LIST_SLOTS:
        v = getattr(r, s)
        if v is not None:
            setattr(n, s, list(v))
    return n


def _plain(v: Any) -> Any:
    """A separate copy of a container of immutable values (the same object for immutable values)."""
    if isinstance(v, (list, dict, set)):
        return v.copy()
    if isinstance(v, deque):
        return deque(v)
    if isinstance(v, np.ndarray):
        return v.copy()
    return v


def fork_instance(inst: SimInstance) -> SimInstance:
    """An independent copy of one simulated engine (its ``_on_finish`` hook still to be rebound)."""
    memo: dict[int, SimRequest] = {}

    def rq(r: SimRequest) -> SimRequest:
        c = memo.get(id(r))
        if c is None:
            c = memo[id(r)] = _copy_request(r)
        return c

    new = SimInstance.__new__(SimInstance)
    d = {k: _plain(v) for k, v in inst.__dict__.items()}
    d["waiting"] = deque(rq(r) for r in inst.waiting)
    d["running"] = [rq(r) for r in inst.running]
    d["reqs"] = {k: rq(r) for k, r in inst.reqs.items()}
    d["rejected"] = {k: rq(r) for k, r in inst.rejected.items()}
    if inst.seg_sched is not None:
        d["seg_sched"] = [(rq(r), need) for r, need in inst.seg_sched]
    d["loading"] = deque((t, rq(r)) for t, r in inst.loading)
    d["kv"] = fork_manager(inst.kv)
    new.__dict__.update(d)
    return new


def fork_manager(kv: KVBlockManager) -> KVBlockManager:
    """An independent copy of an instance's KV block manager (its per-request slots travel with the requests).
    A fork is a rollout: it publishes no KV events to the original's subscribers."""
    new = KVBlockManager.__new__(KVBlockManager)
    d = {k: _plain(v) for k, v in kv.__dict__.items()}
    d["_subscribers"] = []
    if kv.cache is not None:
        d["cache"] = kv.cache.fork()
    if kv.cpu is not None:
        d["cpu"] = kv.cpu.fork()
    new.__dict__.update(d)
    return new


def fork_state(state: ClusterState) -> ClusterState:
    """An independent copy of the client-side cluster state (entries included)."""
    new = ClusterState.__new__(ClusterState)
    new.__dict__.update({k: _plain(v) for k, v in state.__dict__.items()})
    insts = []
    for inst in state._inst:
        c = _Instance.__new__(_Instance)
        for s in _Instance.__slots__:
            setattr(c, s, _plain(getattr(inst, s)))
        entries = {}
        for rid, e in inst.entries.items():
            ce = _Entry.__new__(_Entry)
            for s in _Entry.__slots__:
                setattr(ce, s, getattr(e, s))
            entries[rid] = ce
        c.entries = entries
        insts.append(c)
    new._inst = insts
    return new


def fork(sim: "ClusterSim") -> "ClusterSim":
    """An independent copy of a ``ClusterSim`` at its current time: run either one on, the other is unchanged.

    The fork keeps the original's router in its dispatcher (a planner swaps in its own, ``set_router``), not
    its epoch guard, and reports no progress. Forks and their original must not run concurrently in threads
    (they share the request list).
    """
    cls = type(sim)
    new = cls.__new__(cls)
    d = {k: _plain(v) for k, v in sim.__dict__.items()}
    insts = [fork_instance(i) for i in sim.instances]
    d["instances"] = insts
    state = fork_state(sim.state)
    d["state"] = state
    disp = Dispatcher.__new__(Dispatcher)
    disp.__dict__.update({k: _plain(v) for k, v in sim.dispatcher.__dict__.items()})
    disp.state = state
    disp.guard = None  # an epoch guard reads the original's state
    if disp.admission is not None:
        disp.admission = disp.admission.fork()
    if disp.router_state is not None:  # a signal lag: the router's delayed view and its hook are the fork's own
        disp.router_state = fork_state(sim.dispatcher.router_state)
        disp._on_event = disp._delay
    d["dispatcher"] = disp
    d["_progress"] = None
    new.__dict__.update(d)
    for inst in insts:
        inst._on_finish = new._make_finish_hook(inst)
    return new
