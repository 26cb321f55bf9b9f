"""Prefill/decode disaggregation on the simulator: a request prefilled on one instance, decoded on another.

``DisaggSim`` is a ``ClusterSim`` whose instances have roles (``lbbench.fleet.ROLES``: ``mixed``, ``prefill``,
``decode``) and whose router may answer a ``PairDecision`` (``lbbench.core``). A paired request takes llm-d's
and vLLM's path (llm-d-inference-scheduler ``docs/disagg_pd.md``; vLLM's NIXL connector):

1. **Prefill.** The prefill instance is sent the prompt with one output token (``core.prefill_leg``, llm-d's
   ``max_tokens=1``); it queues, prefills (its prefix cache serves the prompt as usual) and makes that token,
   which nobody sees. Its blocks are freed then (cached blocks stay in its prefix cache); vLLM holds them until
   the decode side has read them, a difference of the transfer's duration.
2. **Transfer.** The KV of every prompt token but the last (vLLM's NIXL connector loads ``prompt - 1`` tokens;
   the decode instance computes the last one), ``kv_bytes_per_token`` x that many bytes, crosses the link
   (``lbbench.kv_links.KVLink``: ``latency + bytes / bandwidth``). **Contention:** every instance has one link
   endpoint (its NIC, or its NVLink port); a transfer holds the prefill instance's egress and the decode
   instance's ingress for its whole duration, so transfers sharing an endpoint are **serialized, first come
   first served** (no bandwidth sharing: a transfer starts when both its endpoints are free). Nothing else
   uses the links. The router's state sees the request on the decode instance from the transfer's start.
3. **Decode admission.** When the KV lands, the decode instance takes it (``SimInstance.import_blocks``): its
   next step computes the last prompt token and makes the first token the client sees. When its blocks do
   not fit, it waits, first come first served per decode instance, and is tried again each time that
   instance's step segment ends (when blocks may have been freed); it is never dropped. KV is taken at a step
   boundary only (the instance's segment in progress is cut after the step running, as an arrival cuts it):
   the block demand of a segment's later steps is counted when the segment ends.

A request sent whole (``Decision``, or ``PairDecision`` with ``prefill`` None) runs as in ``ClusterSim``. Each
disaggregated request's record carries ``prefill_instance``, ``prefill_done_s``, ``kv_ready_s``,
``decode_admit_s`` and ``transfer_bytes`` (``core.PD_RECORD_FIELDS``); its ``instance`` is the decode instance,
its ``cached_prompt_tokens`` the prefill instance's hit. TTFT then splits into the router's queue
(``dispatch_s - arrival_s``), the prefill instance (queue and prefill, ``prefill_done_s - dispatch_s``), the
transfer (``kv_ready_s - prefill_done_s``), the wait for decode blocks (``decode_admit_s - kv_ready_s``) and
the first decode step (``first_token_s - decode_admit_s``).

A fleet without roles never builds this class (``ClusterSim`` runs as before: ``bench/sim_golden.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from ..core import Dispatched, Failed, Request, prefill_leg
from ..kv_links import KVFabric, KVLink
from ..profiles import Profile
from .cluster import _TRANSFER, ClusterSim
from .fork import fork
from .instance import KVTransfer, SimInstance, SimRequest

_START, _LANDED, _RETRY = 0, 1, 2


@dataclass
class _Leg:
    """One disaggregated request between its dispatch and its record."""

    request: Request
    prefill: int
    decode: int
    prefill_done_s: float | None = None
    kv_ready_s: float | None = None
    decode_admit_s: float | None = None
    num_bytes: float = 0.0
    cached_tokens: int | None = None
    decoding: bool = False


class DisaggSim(ClusterSim):
    """A ``ClusterSim`` with instance roles and timed KV transfers. ``roles``: one per instance;
    ``kv_link``: the link between every prefill and decode instance; ``kv_bytes_per_token``: one per instance
    (the prefill instance's figure sizes a transfer; ``lbbench.kv_links.kv_bytes_per_token``)."""

    def __init__(self, profile: Profile | None, num_instances: int, requests: Sequence[Request], *,
                 roles: Sequence[str], kv_link: KVLink, kv_bytes_per_token: Sequence[float], **kw):
        if len(roles) != num_instances or len(kv_bytes_per_token) != num_instances:
            raise ValueError("DisaggSim: one role and one kv_bytes_per_token per instance")
        super().__init__(profile, num_instances, requests, roles=roles, **kw)
        self.roles = list(roles)
        self.kv_link = kv_link
        self.kv_bytes_per_token = list(kv_bytes_per_token)
        self._legs: dict[int, _Leg] = {}
        self._fabric = KVFabric(kv_link)
        self._landed: list[deque[_Leg]] = [deque() for _ in range(num_instances)]
        self._retry_version = [0] * num_instances

    def clone(self) -> "DisaggSim":
        """An independent copy at the current time (``lbbench.sim.fork``), the requests between their prefill
        and their decode (in transfer, landed, waiting for blocks) included."""
        new = fork(self)
        legs = {rid: replace(leg) for rid, leg in self._legs.items()}
        twin = {id(leg): legs[rid] for rid, leg in self._legs.items()}
        new._legs = legs
        new._fabric = self._fabric.copy()
        new._landed = [deque(twin[id(leg)] for leg in q) for q in self._landed]
        new._heap = [(t, k, seq, k2, (data[0], twin[id(data[1])]) if k == _TRANSFER and data[0] != _RETRY else data)
                     for t, k, seq, k2, data in self._heap]  # the same keys in the same order: still a heap
        return new

    # ------------------------------------------------------------------ 1. prefill
    def _send(self, req: Request, i: int) -> None:
        decode = self.dispatcher.decode_of.pop(req.request_id, None)
        if decode is None:
            super()._send(req, i)
            return
        self._legs[req.request_id] = _Leg(req, i, decode)
        self._dispatch_s[req.request_id] = self.now_s
        self._observe(self.instances[i].add(prefill_leg(req), self.now_s))
        self._reschedule(i)

    def _record(self, inst: SimInstance, r: SimRequest, error: str | None) -> None:
        leg = self._legs.get(r.rid)
        if leg is None:
            super()._record(inst, r, error)
            return
        if not leg.decoding and error is None:  # the prefill is done: its KV leaves
            leg.prefill_done_s = r.finish_s
            leg.cached_tokens = r.cached_tokens
            self._push(self.now_s if r.finish_s is None else r.finish_s, _TRANSFER, (_START, leg))
            return
        del self._legs[r.rid]
        r.request = leg.request  # the record names the request the client sent (not its prefill leg)
        super()._record(inst, r, error)
        rec = self.records[-1]
        rec.prefill_instance = leg.prefill
        rec.prefill_done_s, rec.kv_ready_s, rec.decode_admit_s = leg.prefill_done_s, leg.kv_ready_s, leg.decode_admit_s
        rec.transfer_bytes = leg.num_bytes if leg.prefill_done_s is not None else None
        if error is None:
            rec.cached_prompt_tokens = leg.cached_tokens

    # ------------------------------------------------------------------ 2. the transfer
    def _transfer_event(self, t: float, data: object) -> None:
        what, arg = data  # type: ignore[misc]
        if what == _START:
            self._start_transfer(t, arg)
        elif what == _LANDED:
            arg.kv_ready_s = t
            self._landed[arg.decode].append(arg)
            self._admit_landed(arg.decode)
        else:
            d, version = arg
            if version == self._retry_version[d]:
                self._admit_landed(d)

    def _start_transfer(self, t: float, leg: _Leg) -> None:
        p, d = leg.prefill, leg.decode
        leg.num_bytes = (leg.request.prompt_tokens - 1) * self.kv_bytes_per_token[p]
        _, end = self._fabric.reserve(p, d, t, leg.num_bytes)
        # the client-side state sees the request on its decode instance from now on
        self.dispatcher.observe(Dispatched(leg.request, d, t))
        self._push(end, _TRANSFER, (_LANDED, leg))

    # ------------------------------------------------------------------ 3. decode admission
    def _admit_landed(self, d: int) -> None:
        """Hand the KV that landed on ``d`` to its engine (``admit_landed``); try again when it says."""
        retry_s = admit_landed(self.instances[d], self._landed[d], self.now_s, self._observe, self._admitted,
                               self._fail_on)
        self._reschedule(d)
        self._retry_version[d] += 1
        if retry_s is not None:
            self._push(retry_s, _TRANSFER, (_RETRY, (d, self._retry_version[d])))

    @staticmethod
    def _admitted(leg: _Leg, now_s: float) -> None:
        leg.decoding, leg.decode_admit_s = True, now_s

    def _fail_on(self, inst: SimInstance, leg: _Leg, error: str) -> None:
        """``leg`` cannot decode on ``inst``: it fails there (the state and the router see it end)."""
        leg.decoding = True
        self.dispatcher.observe(Failed(leg.request.request_id, inst.index, self.now_s, error))
        self._record(inst, SimRequest(leg.request), error)


def admit_landed(inst: SimInstance, queue: deque, now_s: float, observe: Callable[[list], None],
                 admitted: Callable[[Any, float], None], fail: Callable[[SimInstance, Any, str], None]
                 ) -> float | None:
    """Hand the KV that landed on ``inst`` (``queue``: legs with ``request`` and ``num_bytes``, first come first
    served) to its engine while its blocks fit; the one decode admission of the simulator and of ``serve-sim``'s
    decode instances (``lbbench.engines.vllm.pd``). ``observe`` takes the engine's events, ``admitted(leg, now)``
    each leg taken, ``fail(inst, leg, error)`` each that can never be. Returns when to try again (None: nothing
    is left waiting)."""
    observe(inst.advance(now_s))
    if inst.seg_k and inst.seg_t0 < now_s and (inst.seg_sched or not inst.seg_prefill_only):
        # inside a segment of steps: the blocks of its steps after the first are counted when it ends, so
        # the free count is known at a step boundary only. Cut it after the step in progress (as an arrival
        # does) and take the KV then.
        inst._cut_segment(now_s, 2 if inst.async_scheduling else 1)
        return inst.seg_end
    while queue:
        leg = queue[0]
        req = leg.request
        tokens = req.prompt_tokens - 1
        x = KVTransfer(req, -(-tokens // inst.bs), (), leg.num_bytes, tokens, 0, ())
        if req.prompt_tokens + req.output_tokens > inst.max_model_len:
            queue.popleft()
            fail(inst, leg, f"prompt {req.prompt_tokens} + output {req.output_tokens} tokens exceed "
                            f"max_model_len {inst.max_model_len} of decode instance {inst.index}")
            continue
        events = inst.import_blocks(x, now_s)
        if events is None:
            break
        queue.popleft()
        admitted(leg, now_s)
        observe(events)
    if not queue:
        return None
    te = inst.next_event_s()  # blocks are freed when a step segment ends: try again then
    if te is None:  # idle and still too small: the instance can never hold it
        while queue:
            leg = queue.popleft()
            fail(inst, leg, f"its KV ({leg.request.prompt_tokens} tokens) does not fit decode "
                            f"instance {inst.index}'s {inst.num_blocks} blocks")
    return te
