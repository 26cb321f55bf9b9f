"""The scheduler of a simulated vLLM instance: which requests each engine step runs, and what it costs.

It follows vLLM v1's ``Scheduler.schedule`` (vLLM-project/vllm, ``vllm/v1/core/sched/scheduler.py`` at
00024d314514900f361ad072af6931e403b7f589, Apache-2.0): running requests first, in admission order (a
decoding request takes one token, a partially prefilled one what the token budget allows), then waiting
requests while ``max_num_batched_tokens``, ``max_num_seqs`` and the KV blocks allow, in the order of the
instance scheduler (``fcfs``, ``bin_packing``, ``least_work_left``, ``priority``). It asks the block manager
(``block_manager.py``) for room and never counts blocks itself: an allocation that fails returns ``None`` and
the newest running request (under ``priority`` the one of largest (priority, arrival)) is preempted by
recompute; no waiting request is admitted in a step that preempted. vLLM V0 (profile ``engine.scheduler =
"v0"``, without chunked prefill) prefills waiting requests only, or else decodes.

Each planned step's time comes from the profile's step model (``lbbench.step_model``): the decode cost of the
batch, its KV context read, the prefill chunks. A step whose batch is pure decode with nothing admissible is
repeated until a request finishes, a block allocation would fail or something reaches the instance: such a
run of steps is one *segment*, planned in O(1) (plus O(block_size) for its block demand), because a
decoding request's counts follow the step clock (``key + clock`` tokens computed) and the steps' times form
an arithmetic series. ``SimInstance`` (``instance.py``) runs the planned segments on the virtual clock.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Callable

from ..core import Event, Preempted, Request
from ..errors import InputError
from ..priority import request_priority
from ..profiles import Profile
from .block_manager import KVBlockManager
from .offload import CpuTier
from .request import SimRequest

INSTANCE_SCHEDULERS = ("fcfs", "bin_packing", "least_work_left", "priority")


class SimScheduler:
    """Batch formation and step planning of one instance (see the module docstring); ``SimInstance`` adds
    the clock, the lifecycle events and the public API."""

    def __init__(self, profile: Profile, index: int, scheduler: str, chunked_prefill: bool | None,
                 check_invariants: bool, skip_ahead: bool, prefix_caching: bool | None):
        if scheduler not in INSTANCE_SCHEDULERS:
            raise ValueError(f"instance_schedulers: unknown {scheduler!r} "
                             f"(choose from {', '.join(INSTANCE_SCHEDULERS)})")
        p = profile
        self.profile = profile
        self.index = index
        self.scheduler = scheduler
        self.check_invariants = check_invariants  # assert the invariants at the end of every planned step
        self.chunked_prefill = p.chunked_prefill if chunked_prefill is None else chunked_prefill
        self.skip_ahead = skip_ahead  # False: one step per segment (reference for tests)
        #: vLLM V1's async scheduling (profile ``engine.async_scheduling``): the scheduler plans step k + 1 while
        #: step k runs, so a request that arrives during step k is first scheduled in step k + 2
        self.async_scheduling = p.async_scheduling and p.scheduler == "v1"
        #: vLLM's --long-prefill-token-threshold: a request's prefill chunk per step is at most this (0: no cap)
        self.long_prefill_token_threshold = p.long_prefill_token_threshold if self.chunked_prefill else 0
        self.bs = p.block_size
        self.num_blocks = p.num_kv_blocks
        self.max_num_seqs = p.max_num_seqs
        self.budget = p.max_num_batched_tokens if self.chunked_prefill else max(
            p.max_num_batched_tokens, p.max_model_len)
        # V0 without chunked prefill: prefill-only and decode-only steps; admission keeps a 1 % watermark
        self.v0 = p.scheduler == "v0" and not self.chunked_prefill
        caching = p.enable_prefix_caching if prefix_caching is None else prefix_caching
        cpu = None
        if p.cpu_offload_blocks:
            if not caching:
                raise InputError(f"profile {p.name}: its CPU KV tier (kv.cpu_offload_blocks) finds blocks by their "
                                 "prefix hashes and needs prefix caching on", "prefix_caching")
            cpu = CpuTier(p.cpu_offload_blocks, self.bs, p.kv_bytes_per_block, p.cpu_link_bytes_s)
        self.kv = KVBlockManager(self.num_blocks, self.bs, prefix_caching=caching,
                                 watermark_blocks=int(0.01 * self.num_blocks) if self.v0 else 0, cpu=cpu,
                                 bytes_per_block=p.kv_bytes_per_block)
        #: every step time goes through the profile's step model; a pure-decode step's cost without its
        #: context term is tabulated once per batch size (a decoding batch never exceeds ``max_num_seqs``)
        self.step_model = sm = p.step_model
        self._decode_s = tuple(sm.decode_s(n) for n in range(self.max_num_seqs + 1))
        self._c = sm.context_token_s
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        #: (load done, request) of the requests loading KV from the CPU tier, in the link's order
        self.loading: deque[tuple[float, SimRequest]] = deque()
        self.reqs: dict[int, SimRequest] = {}
        self.num_preemptions = 0
        self.clock = 0  # decode steps run so far
        # decoding aggregates
        self.n_dec = 0
        self.sum_key = 0  # sum of (num_computed - clock) over decoding requests
        self.heap: list[tuple[int, int, int]] = []  # (finish clock, rid, version)
        # the segment in progress
        self.seg_t0 = 0.0
        self.seg_k = 0  # planned steps; 0 = idle
        self.seg_end = 0.0  # when the segment's last step ends: seg_t0 + _cum(seg_k), kept with seg_k
        self.seg_a = 0.0  # its first step's time
        self.seg_b = 0.0  # how much each further step is longer
        self.seg_sched: list[tuple[SimRequest, int]] | None = None  # a single step's prefill work: (request, tokens)
        #: the step in progress is off the decode clock: a V0 prefill-only step (decodes paused), or a wait for
        #: a load from the CPU tier that runs nothing
        self.seg_prefill_only = False
        self.now_s = 0.0  # time of the last step boundary

    #: the priority policy's source of a request's priority (default: its predicted work,
    #: ``lbbench.priority``); an emulated server sets it to what the client sent in ``priority``
    priority_of: Callable[[Request], int] | None = None

    # ------------------------------------------------------------------ decoding bookkeeping
    def _start_decoding(self, r: SimRequest, off_clock_s: float | None = None) -> None:
        """``r`` just produced a token at the end of step ``self.clock``, or, from a V0 prefill-only step that
        did not advance the clock, at ``off_clock_s``."""
        clock = self.clock
        r.decoding = True
        r.c0 = clock
        r.g0 = g = r.generated
        r.key = key = r.num_computed - clock
        self.n_dec += 1
        self.kv.start_decoding(key)
        self.sum_key += key
        r.version = v = r.version + 1
        heapq.heappush(self.heap, (clock + r.output_tokens - g, r.rid, v))
        if off_clock_s is None:
            r.ranges.append((clock, clock))
        else:  # its next token comes with the next decode step
            r.ranges.append((clock + 1, clock))
            if r.extra_times is None:
                r.extra_times = []
            r.extra_times.append(off_clock_s)

    def _stop_decoding(self, r: SimRequest) -> None:
        """Freeze the counters of a decoding request (before preemption or finish; the block manager's
        ``free_decoding`` follows)."""
        clock = self.clock
        key = r.key
        r.generated = r.g0 + (clock - r.c0)
        r.num_computed = key + clock
        r.decoding = False
        self.n_dec -= 1
        self.sum_key -= key
        r.version += 1
        ranges = r.ranges
        ranges[-1] = (ranges[-1][0], clock)

    def _free(self, r: SimRequest, preempted: bool = False) -> None:
        if r.decoding:
            self._stop_decoding(r)
            self.kv.free_decoding(r, r.key, preempted)
        else:
            self.kv.free(r, preempted)

    def _preempt(self, r: SimRequest, now_s: float, events: list[Event]) -> None:
        self._free(r, preempted=True)
        self.running.remove(r)
        r.num_computed = 0
        r.num_preemptions += 1
        self.num_preemptions += 1
        waiting = self.waiting
        if waiting and waiting[0].blocks:
            self._wait_behind_holders(r)
        else:  # no request waits holding blocks (always so without a CPU tier or imports)
            waiting.appendleft(r)
        events.append(Preempted(r.rid, self.index, now_s))

    def _wait_behind_holders(self, r: SimRequest) -> None:
        """Queue ``r`` at the front of the waiting queue, but behind the waiting requests that hold blocks
        (those back from a CPU load or imported from another instance: they need no new block to run and go
        first, so that requests waiting with blocks never starve the head of the queue)."""
        waiting = self.waiting
        if not waiting or not waiting[0].blocks:  # no holder (always so without a CPU tier or imports)
            waiting.appendleft(r)
            return
        i = 1
        while i < len(waiting) and waiting[i].blocks:
            i += 1
        waiting.insert(i, r)

    # ------------------------------------------------------------------ policies
    def _pick_waiting(self, unseen: bool = False) -> SimRequest | None:
        """The waiting request the instance scheduler admits next; ``unseen``: only among those the (async)
        scheduler can see already (None when none)."""
        waiting = self.waiting
        if unseen:
            clock = self.clock
            waiting = [r for r in waiting if r.eligible_clock <= clock]  # type: ignore[assignment]
            if not waiting:
                return None
        if self.scheduler == "fcfs" or len(waiting) == 1:
            return waiting[0]
        if self.scheduler == "least_work_left":
            return min(waiting, key=lambda r: r.expected - r.generated)
        if self.scheduler == "priority":  # vLLM's priority policy: (priority, arrival) first
            return min(waiting, key=self._priority_key)
        # bin_packing: the largest request that fits in free memory, FCFS among ties
        free_tokens = self.kv.num_free_blocks * self.bs
        best = None
        best_size = -1
        for r in waiting:
            size = r.num_tokens
            if size <= free_tokens and size > best_size:
                best, best_size = r, size
        return best if best is not None else waiting[0]

    def _priority_key(self, r: SimRequest) -> tuple[int, float, int]:
        """vLLM's priority order: the request's priority, then arrival."""
        prio = self.priority_of(r.request) if self.priority_of is not None else request_priority(
            r.request, self.profile)
        return (prio, r.request.arrival_s, r.rid)

    def _victim(self, first: int) -> SimRequest:
        """The running request to preempt: the newest, or under the priority policy the one with the largest
        (priority, arrival), as vLLM does. Only requests not yet scheduled in this step (``running[first:]``,
        the one that needs the block included) are candidates, so a step never takes back what it already
        handed out."""
        if self.scheduler == "priority":
            return max(self.running[first:], key=self._priority_key)
        return self.running[-1]

    # ------------------------------------------------------------------ planning
    def _plan(self, events: list[Event]) -> None:
        """Schedule the next step at ``self.now_s`` and decide how many steps it repeats.

        Decoding requests are not listed in the schedule: they follow the step clock. ``seg_sched`` holds only
        the prefill work of the step.
        """
        if self.loading:
            self._complete_loads()
        running = self.running
        waiting = self.waiting
        if not running and not waiting:
            self._plan_idle()
            return
        t = self.now_s
        self.seg_prefill_only = False
        kv = self.kv
        if waiting and self.v0:
            if self.scheduler == "fcfs" and kv.cache is None:
                # the usual outcome under load, decided without _admit: the head of the queue does not fit (the
                # same tests as _admit's first iteration, which would break there)
                r = waiting[0]
                need = r.prompt_tokens + r.generated - r.num_computed
                if not (len(running) >= self.max_num_seqs or need > self.budget  # kv.can_allocate, inlined (hot)
                        or -(-(r.num_computed + need) // kv.block_size) - r.blocks
                        > kv.num_blocks - kv.num_used_blocks - (kv.watermark_blocks if running else 0)):
                    if self._plan_prefill_only(t):
                        return
            elif self._plan_prefill_only(t):
                return
        clock = self.clock
        n = self.n_dec
        demand = kv.hist[(-clock) % kv.block_size]  # kv.allocate_decode_step(clock), inlined (hot)
        if n == len(running) and demand <= kv.num_blocks - kv.num_used_blocks:
            # common case: every running request decodes and their new blocks fit
            kv.num_used_blocks += demand
            if not waiting or self.v0:  # nothing to admit (V0 admits only in prefill-only steps)
                sched = None
            else:
                sched = []
                self._admit(self.budget - n, 0, sched)
            preempted = False
        else:
            sched = []
            preempted = self._schedule_running(t, events, sched)
            n = self.n_dec
            # waiting requests, unless this step preempted (V0 admits only in prefill-only steps)
            if not preempted and not self.v0:
                self._admit(self.budget - n - sum(need for _, need in sched), 0, sched)
        if not sched:
            if not n:
                if preempted and not running:  # the step preempted all that ran: what waits is admitted now
                    self._plan(events)  # (only requests back from a CPU load can hold the blocks it missed)
                    return
                # nothing fits (every waiting request needs more than is free and nothing runs)
                self._plan_idle()
                return
            if not preempted:
                # pure decode: repeat until a finish, a failing allocation, or an external event
                k = 1
                if self.skip_ahead:
                    heap = self.heap
                    reqs = self.reqs
                    while heap:  # _peek_finish, inlined (hot)
                        fc, rid, ver = heap[0]
                        r = reqs.get(rid)
                        if r is None or r.version != ver or not r.decoding:
                            heapq.heappop(heap)
                            continue
                        if fc - clock > 1:
                            k = min(fc - clock, kv.max_decode_steps(clock, n))
                        break
                    if self.async_scheduling and waiting and k > 1:  # re-plan when the next arrival is seen
                        seen = min((r.eligible_clock for r in waiting if r.eligible_clock > clock), default=0)
                        if seen:
                            k = min(k, seen - clock)
                c = self._c
                self.seg_a = a = self._decode_s[n] + c * (self.sum_key + n * clock + n)
                self.seg_b = b = c * n
                self.seg_sched = None
                self.seg_t0 = t
                self.seg_k = k
                self.seg_end = t + (k * a + b * k * (k - 1) * 0.5)
                if self.loading:  # re-plan once the step in progress when the next load completes ends
                    self._cut_segment(self.loading[0][0])
                if self.check_invariants:
                    self._assert_invariants([])
                return
        decode_a = self._decode_s[n] + self._c * (self.sum_key + n * clock + n)
        self.seg_a = decode_a + self.step_model.prefill_s([(r.num_computed, need) for r, need in sched or ()], n)
        self._plan_one_step(t, sched if sched is not None else [])

    def _plan_idle(self) -> None:
        """Nothing can run now: stay idle, or, while a load from the CPU tier runs, wait for it (a step
        off the decode clock that runs nothing)."""
        if not self.loading:
            self.seg_k = 0
            return
        t = self.now_s
        self.seg_prefill_only = True
        self.seg_a = max(self.loading[0][0] - t, 0.0)
        self._plan_one_step(t, [])
        self.seg_end = max(self.loading[0][0], t)  # exactly when the load completes

    def _complete_loads(self) -> None:
        """Loads done by now: their requests hold their loaded blocks as computed and go back to the head of
        the waiting queue (in the order the loads ran)."""
        loading, done = self.loading, []
        limit = self.now_s + 1e-12
        while loading and loading[0][0] <= limit:
            r = loading.popleft()[1]
            r.num_computed = self.kv.finish_load(r)
            done.append(r)
        self.waiting.extendleft(reversed(done))

    def _cut_segment(self, t: float, lag: int = 1) -> int:
        """The step of the segment in progress that runs at ``t`` (``lag`` 1), or the one after it (``lag`` 2:
        async scheduling planned it already), becomes its last: the instance re-plans at its end (something
        reaches the instance, or a load completes, at ``t``). Returns the clock of the first step planned
        after ``t``'s news."""
        m = self._steps_done_by(t - self.seg_t0)
        if m + lag < self.seg_k:
            self.seg_k = k = m + lag
            self.seg_end = self.seg_t0 + (k * self.seg_a + self.seg_b * k * (k - 1) * 0.5)
        return self.clock + m + lag

    def _cum(self, k: int) -> float:
        return k * self.seg_a + self.seg_b * k * (k - 1) * 0.5

    def _steps_done_by(self, dt: float) -> int:
        """Largest m with _cum(m) <= dt (steps of the current segment finished by then)."""
        if dt <= 0:
            return 0
        a, b = self.seg_a, self.seg_b
        if b <= 0:
            m = int(dt / a)
        else:
            # b/2 m^2 + (a - b/2) m - dt = 0
            h = a - 0.5 * b
            m = int((-h + math.sqrt(h * h + 2 * b * dt)) / b)
        while m > 0 and self._cum(m) > dt:
            m -= 1
        while self._cum(m + 1) <= dt:
            m += 1
        return min(m, self.seg_k)

    def _plan_one_step(self, t: float, sched: list[tuple[SimRequest, int]]) -> None:
        """The step at ``t`` runs alone (``seg_a`` is its time): it prefills ``sched``."""
        self.seg_b = 0.0
        self.seg_sched = sched
        self.seg_t0 = t
        self.seg_k = 1
        self.seg_end = t + (self.seg_a + self.seg_b * 0 * 0.5)  # seg_t0 + _cum(1)
        if self.check_invariants:
            self._assert_invariants(sched)

    def _admit(self, budget: int, reserve_blocks: int, sched: list[tuple[SimRequest, int]]) -> None:
        """Move waiting requests (in scheduler order) to running while the token budget, ``max_num_seqs`` and
        the free blocks beyond ``reserve_blocks`` allow; a prompt larger than the budget is chunked only with
        chunked prefill. Appends ``(request, tokens)`` to ``sched``."""
        kv = self.kv
        waiting, running = self.waiting, self.running
        fcfs = self.scheduler == "fcfs"
        max_seqs, chunked = self.max_num_seqs, self.chunked_prefill
        long_chunk = self.long_prefill_token_threshold
        unseen = self.async_scheduling and bool(running)  # the newest arrivals may not be visible yet
        while waiting and budget > 0 and len(running) < max_seqs:
            # requests back from a CPU load hold their blocks and wait at the head: they go first
            r = waiting[0] if fcfs or waiting[0].blocks else self._pick_waiting(unseen)
            if r is None or (unseen and r.eligible_clock > self.clock):
                break  # FCFS: the rest arrived later still; otherwise nothing visible is left
            hit = kv.lookup(r) if kv.cache is not None else None  # the cached prefix it would reuse
            if hit is not None and hit.cpu:  # blocks to load from the CPU tier first
                done_s = kv.allocate_load(r, hit, reserve_blocks, self.now_s)
                if done_s is None:
                    break
                if r is waiting[0]:
                    waiting.popleft()
                else:
                    waiting.remove(r)
                self.loading.append((done_s, r))
                continue
            computed = hit.blocks * self.bs if hit is not None else r.num_computed
            need = r.prompt_tokens + r.generated - computed
            if 0 < long_chunk < need:
                need = long_chunk
            if need > budget:
                if not chunked:
                    break
                need = budget
            if kv.allocate_slots(r, need, hit, reserve_blocks) is None:
                break
            if r is waiting[0]:
                waiting.popleft()
            else:
                waiting.remove(r)
            running.append(r)
            r.num_computed = computed
            sched.append((r, need))
            budget -= need

    def _plan_prefill_only(self, t: float) -> bool:
        """V0: admit waiting requests (scheduler order) whose whole prompt fits the budget and the free blocks
        above the watermark; if any, the step prefills only them. Returns whether such a step was planned. (In
        the FCFS, no-cache case ``_plan`` calls it only when the head of the queue fits.)"""
        reserve = self.kv.watermark_blocks if self.running else 0
        sched: list[tuple[SimRequest, int]] = []
        self._admit(self.budget, reserve, sched)
        if not sched:
            return False
        self.seg_a = self._decode_s[0] + self.step_model.prefill_s([(r.num_computed, need) for r, need in sched], 0)
        self.seg_prefill_only = True
        self._plan_one_step(t, sched)
        return True

    def _schedule_running(self, t: float, events: list[Event], sched: list[tuple[SimRequest, int]]) -> bool:
        """General case: walk the running requests in admission order, asking for blocks and preempting the
        newest when they run out. Budget is reserved for the decoding requests so that every one of them
        advances each step (a partially prefilled request never starves a decode; vLLM reaches the same
        result by ordering). Returns whether anything was preempted."""
        bs = self.bs
        kv = self.kv
        running = self.running
        clock = self.clock
        if self.n_dec == len(running) and self.scheduler != "priority":
            # every running request decodes (no budget question): only those at a block boundary need a block; the
            # newest requests are preempted, one at a time, when none is free. The victims are the tail of the list,
            # so once one of the requests that need a block was preempted, every later one was too.
            at = (-clock) % bs
            preempted = False
            for r in [r for r in running if r.key % bs == at]:
                if not r.decoding:  # preempted as a victim already
                    break
                while kv.num_used_blocks >= kv.num_blocks:  # kv.allocate_decode_block(), inlined (hot)
                    victim = running[-1]
                    preempted = True
                    self._preempt(victim, t, events)
                    if victim is r:
                        break
                else:
                    kv.num_used_blocks += 1
                    continue
                break  # r itself was preempted: it was the last one
            return preempted
        budget = self.budget
        preempted = False
        dec_left = self.n_dec
        i = 0
        while i < len(running):
            r = running[i]
            if r.decoding:
                dec_left -= 1
                if (r.key + clock) % bs:  # its next token fits in the blocks it holds
                    budget -= 1
                    i += 1
                    continue
                need = 1
            else:
                need = min(r.num_tokens - r.num_computed, budget - dec_left)
                if 0 < self.long_prefill_token_threshold < need:
                    need = self.long_prefill_token_threshold
                if need <= 0:
                    i += 1
                    continue
            while not (kv.allocate_decode_block() if r.decoding else kv.allocate_slots(r, need) is not None):
                victim = self._victim(i)
                preempted = True
                if victim.decoding and victim is not r:
                    dec_left -= 1
                self._preempt(victim, t, events)
                if victim is r:
                    break
            else:
                if not r.decoding:
                    sched.append((r, need))
                budget -= need
                i += 1
                continue
            # r itself was preempted; the list shrank, continue at the same index
        return preempted

    def _assert_invariants(self, sched: list[tuple[SimRequest, int]]) -> None:
        """The step just planned keeps the token budget and ``max_num_seqs``; the block manager's counts add
        up (``KVBlockManager.check``)."""
        decoding = 0 if self.seg_prefill_only else self.n_dec
        assert decoding + sum(need for _, need in sched) <= self.budget, "token budget exceeded"
        assert len(self.running) <= self.max_num_seqs, "max_num_seqs exceeded"
        assert self.n_dec == sum(1 for r in self.running if r.decoding)
        # blocks are held by the running requests, those loading from the CPU tier and those back from a load
        holders = self.running + [r for _, r in self.loading] + [r for r in self.waiting if r.blocks]
        self.kv.check(holders, self.clock, decode_growth=bool(self.n_dec) and not self.seg_prefill_only)
