"""One simulated vLLM V1 engine instance, in virtual time: the scheduler's planned steps on a step clock.

An instance is three rooms, as vLLM v1's engine core is:

- the scheduler (``scheduler.py``, ``SimScheduler``, which this class extends): which requests each step runs
  (continuous batching under ``max_num_batched_tokens`` and ``max_num_seqs``, chunked prefill on or off,
  vLLM V0 semantics on request, the instance schedulers ``fcfs``, ``bin_packing``, ``least_work_left``,
  ``priority``, preemption by recompute) and what the step costs (the profile's step model,
  ``lbbench.step_model``);
- the KV block manager (``block_manager.py``, ``self.kv``): blocks, prefix hashes and the prefix cache
  (``prefix_cache.py``), eviction; the scheduler asks it for room;
- this class: the step clock. It runs the planned steps (a single mixed step, or a *segment* of pure-decode
  steps advanced in O(1)), turns their ends into lifecycle events (``StepsAdvanced``, ``FirstToken``,
  ``Finished``, ``Preempted``, ``Failed``), and offers the public API (``add``, ``advance``, ``abort``, the
  counters a ``/metrics`` scrape or a timeline sample reads).

Per request the instance keeps the clock ranges in which it produced tokens; with the log of step end times
(``_ends``) that gives exact TTFT and every inter-token gap.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core import Event, Failed, Finished, FirstToken, Request, StepsAdvanced
from ..profiles import Profile
from .request import SimRequest
from .scheduler import INSTANCE_SCHEDULERS, SimScheduler

__all__ = ["INSTANCE_SCHEDULERS", "KVTransfer", "SimInstance", "SimRequest"]


@dataclass(frozen=True)
class KVTransfer:
    """What moving a request's KV to another instance carries (``SimInstance.export``): the request, its
    blocks (count, the keys of its full keyed blocks, bytes), how far it got, and the times of the tokens it
    made before the move."""

    request: Request
    num_blocks: int
    block_hashes: tuple[int, ...]
    num_bytes: float
    num_computed_tokens: int
    generated_tokens: int
    token_times_s: tuple[float, ...]


class SimInstance(SimScheduler):
    """A vLLM-like engine driven by ``add`` and ``advance`` in virtual time."""

    def __init__(self, profile: Profile, index: int = 0, scheduler: str = "fcfs",
                 chunked_prefill: bool | None = None, check_invariants: bool = False,
                 skip_ahead: bool = True, prefix_caching: bool | None = None):
        super().__init__(profile, index, scheduler, chunked_prefill, check_invariants, skip_ahead, prefix_caching)
        self.max_model_len = min(profile.max_model_len, self.num_blocks * self.bs)
        self.rejected: dict[int, SimRequest] = {}  # failed at admission, until collected
        # step end times, ends[k-1] = end of step k
        self._ends = np.empty(4096)

    # ------------------------------------------------------------------ public API
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests waiting, those loading KV from the CPU tier included (vLLM counts them waiting)."""
        return len(self.waiting) + len(self.loading)

    @property
    def kv_usage(self) -> float:
        return self.kv.usage

    @property
    def used_blocks(self) -> int:
        """Blocks in use (the block manager's count)."""
        return self.kv.num_used_blocks

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Share of prompt tokens reused from the cache at first admission (None: caching off)."""
        return self.kv.prefix_cache_hit_rate

    def generated_tokens(self, rid: int) -> int:
        r = self.reqs[rid]
        return r.g0 + self.clock - r.c0 if r.decoding else r.generated

    def is_decoding(self, rid: int) -> bool:
        r = self.reqs.get(rid)
        return r is not None and r.decoding

    def segment_progress(self, now_s: float) -> tuple[int, float | None]:
        """Inside the segment in progress: how many of its steps have ended by ``now_s`` (each decoding request
        has that many more tokens than ``generated_tokens`` says), and when the next of its steps ends. A
        real-time emulator streams tokens step by step from this; the simulator itself only materializes whole
        segments."""
        k = self.seg_k
        if k == 0:
            return 0, None
        if self.seg_sched is not None:  # a single mixed step
            return 0, self.seg_t0 + self._cum(1)
        m = min(self._steps_done_by(now_s - self.seg_t0), k)
        return m, self.seg_t0 + self._cum(min(m + 1, k))

    def next_event_s(self) -> float | None:
        """End of the segment in progress (when state next changes), or None if idle."""
        return self.seg_end if self.seg_k else None

    def add(self, request: Request, now_s: float) -> list[Event]:
        """The request reaches this instance at ``now_s``; returns events that happened up to then."""
        events = self.advance(now_s)
        r = SimRequest(request)
        if r.prompt_tokens + r.output_tokens > self.max_model_len:
            self.rejected[r.rid] = r
            events.append(Failed(r.rid, self.index, now_s,
                                 f"prompt {r.prompt_tokens} + output {r.output_tokens} tokens exceed "
                                 f"max_model_len {self.max_model_len}"))
            return events
        self.reqs[r.rid] = r
        self.kv.add_request(r)
        self.waiting.append(r)
        r.eligible_clock = self._replan_at(now_s, events, 2 if self.async_scheduling else 1)
        return events

    def _replan_at(self, now_s: float, events: list[Event], lag: int = 1) -> int:
        """Something reached the instance at ``now_s``: plan a step now when idle; otherwise the step in
        progress runs with the old batch (with async scheduling, ``lag`` 2, the step after it too, planned
        already), and the instance re-plans at its end. Returns the clock of the first step that sees it."""
        if self.seg_k == 0 or (self.seg_prefill_only and not self.seg_sched):  # idle, or only waiting for a load
            clock = self.clock
            self.now_s = max(self.now_s, now_s)
            self._plan(events)
            return clock
        return self._cut_segment(now_s, lag)

    def advance(self, until_s: float) -> list[Event]:
        """Run every step that ends at or before ``until_s``."""
        events: list[Event] = []
        if not self.seg_k:
            return events
        limit = until_s + 1e-12
        while self.seg_k:
            end = self.seg_end
            if end > limit:
                break
            self._finish_segment(end, events)
            self._plan(events)
        return events

    def export(self, rid: int) -> KVTransfer:
        """What a KV transfer of request ``rid`` (decoding here: its prefill is done) needs, for prefill /
        decode disaggregation. Nothing changes here: the caller ``abort``s the request once it is moved."""
        r = self.reqs[rid]
        if not r.decoding:
            raise ValueError(f"request {rid}: only a decoding request's KV can be exported (prefill first)")
        clock = self.clock
        num_computed = r.key + clock
        num_blocks, keys, num_bytes = self.kv.export(r, num_computed)
        return KVTransfer(r.request, num_blocks, keys, num_bytes, num_computed, r.g0 + clock - r.c0,
                          tuple(float(t) for t in self.token_times(r, clock)))

    def import_blocks(self, transfer: KVTransfer, now_s: float) -> list[Event] | None:
        """Take over a request exported from another instance at ``now_s`` (``advance(now_s)`` first): its
        blocks are allocated as computed and it decodes from its next step on, with no prefill (its next token
        is one step's token). Returns the events of that re-plan, or None (nothing changed) when its blocks
        do not fit. It waits, holding its blocks, at the head of the waiting queue (behind other holders).
        A transfer with no token made (``generated_tokens`` 0, the KV of all but the prompt's last token: what
        a prefill instance hands over in vLLM's NIXL connector) makes the first token here, in that step."""
        r = SimRequest(transfer.request)
        if (transfer.generated_tokens < 0 or transfer.generated_tokens >= r.output_tokens
                or r.prompt_tokens + r.output_tokens > self.max_model_len):
            raise ValueError(f"request {r.rid}: cannot be imported (made {transfer.generated_tokens} of "
                             f"{r.output_tokens} tokens, max_model_len {self.max_model_len})")
        self.kv.add_request(r)
        if self.kv.import_blocks(r, transfer.num_computed_tokens) is None:
            return None
        r.num_computed = transfer.num_computed_tokens
        r.generated = transfer.generated_tokens
        if transfer.token_times_s:
            r.first_token_s = transfer.token_times_s[0]
            r.extra_times = list(transfer.token_times_s)
        self.reqs[r.rid] = r
        self._wait_behind_holders(r)
        events: list[Event] = []
        self._replan_at(now_s, events)
        return events

    def abort(self, rid: int) -> None:
        """Remove a request (client went away); frees its blocks."""
        r = self.reqs.pop(rid, None)
        if r is None:
            return
        if r in self.waiting:
            self.waiting.remove(r)
            if r.blocks:  # back from a CPU load, or imported: it holds its blocks while it waits
                self.kv.free(r)
        elif r in self.running:
            # a decoding request at a block boundary got a block for the step in progress: it goes back too
            step_block = (r.decoding and self.seg_k and not self.seg_prefill_only
                          and not (r.key + self.clock) % self.bs)
            self._free(r)
            self.running.remove(r)
            if step_block:
                self.kv.free_decode_block()
        else:  # loading from the CPU tier
            self.loading = deque(item for item in self.loading if item[1] is not r)
            self.kv.cancel_load(r)

    # ------------------------------------------------------------------ timing helpers
    def _log_steps(self, t0: float, k: int) -> None:
        c = self.clock
        need = c + k
        if need > len(self._ends):
            grown = np.empty(max(need, 2 * len(self._ends)))
            grown[:c] = self._ends[:c]
            self._ends = grown
        if k == 1:
            self._ends[c] = t0 + self.seg_a
            return
        a, b = self.seg_a, self.seg_b
        if k <= 24:  # short segments: scalar float arithmetic, the same operations in the same order as below
            self._ends[c:need] = [t0 + j * a + b * j * (j - 1) * 0.5 for j in range(1, k + 1)]
            return
        j = np.arange(1, k + 1, dtype=np.float64)
        self._ends[c:need] = t0 + j * a + b * j * (j - 1) * 0.5

    def _finish_segment(self, end_s: float, events: list[Event]) -> None:
        k = self.seg_k
        sched = self.seg_sched
        off_clock = self.seg_prefill_only
        clock = self.clock
        if off_clock:  # V0 prefill-only step: the decode clock stands still
            k = 0
        else:
            if k == 1 and clock < len(self._ends):  # _log_steps' one-step case, inlined (hot)
                self._ends[clock] = self.seg_t0 + self.seg_a
            else:
                self._log_steps(self.seg_t0, k)
                if sched is None:  # the block demand of steps 2..k of a pure-decode segment
                    self.kv.allocate_decode_steps(clock, k, self.n_dec)
            clock += k
            self.clock = clock
            events.append(StepsAdvanced(self.index, end_s, k))
        self.now_s = end_s
        self.seg_k = 0
        if sched:
            reqs = self.reqs
            for r, need in sched:
                if r.rid not in reqs:
                    continue
                r.num_computed += need
                if r.num_computed == r.prompt_tokens + r.generated:  # num_tokens
                    r.generated += 1
                    if r.first_token_s is None:
                        r.first_token_s = end_s
                    events.append(FirstToken(r.rid, self.index, end_s))
                    self._start_decoding(r, end_s if off_clock else None)
        # finishes
        heap = self.heap
        if heap and heap[0][0] <= clock:
            reqs = self.reqs
            while heap and heap[0][0] <= clock:
                fc, rid, ver = heapq.heappop(heap)
                r = reqs.get(rid)
                if r is None or r.version != ver or not r.decoding:
                    continue
                self._free(r)
                self.running.remove(r)
                del reqs[rid]
                r.finish_s = end_s
                events.append(Finished(rid, self.index, end_s, r.generated))
                self._on_finish(r)
        if self.check_invariants:
            kv = self.kv
            assert 0 <= kv.num_used_blocks <= kv.num_blocks, kv.num_used_blocks
            assert len(self.running) <= self.max_num_seqs

    # hook for the cluster to collect finished requests
    _on_finish: Callable[[SimRequest], None] = staticmethod(lambda r: None)

    def token_times(self, r: SimRequest, clock: int | None = None) -> np.ndarray:
        """Times of every token of a finished (or frozen) request, or, given the ``clock``, of a decoding
        request's tokens so far."""
        ends = self._ends
        ranges = r.ranges if clock is None else r.ranges[:-1] + [(r.ranges[-1][0], clock)]
        parts = [ends[a - 1:b] for a, b in ranges]
        if r.extra_times:
            parts.append(r.extra_times)
            times = np.concatenate(parts)
            times.sort()
            return times
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
