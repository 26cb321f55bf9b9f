"""One simulated vLLM V1 engine instance, in virtual time.

What is modelled (vLLM V1 scheduler semantics):

- continuous batching: every engine step first schedules the *running* requests
  in admission order (a decoding request takes 1 token, a partially prefilled one
  takes what the token budget allows), then admits *waiting* requests while the
  per-step token budget (``max_num_batched_tokens``), ``max_num_seqs`` and free KV
  blocks allow, in the order of the instance scheduler (``fcfs``, ``bin_packing``,
  ``least_work_left``);
- paged KV cache: a request holds ``ceil(num_computed_tokens / block_size)`` blocks;
  when a running request cannot get the block its next token needs, the newest
  running request is preempted by recompute (its blocks are freed, it goes back to
  the front of the waiting queue and later re-prefills prompt + generated tokens);
  no waiting request is admitted in a step that preempted;
- chunked prefill on (a prompt is split across steps by the budget) or off (a
  prompt's prefill runs whole in one step, mixed with the running decodes);
- vLLM V0 semantics (profile ``engine.scheduler = "v0"``, without chunked
  prefill), as the paper ran: a step either prefills waiting requests only
  (FCFS while the budget, ``max_num_seqs`` and free blocks above a 1 %
  watermark allow; the running decodes pause for it) or, when nothing can be
  admitted, decodes the running requests only. A prefill-only step does not
  advance the decode clock; the first tokens it produces are kept apart;
- automatic prefix caching (profile ``kv.enable_prefix_caching``, vLLM V1's
  default): at admission a request reuses its cached leading blocks and
  prefills only the rest; freed blocks stay cached until the free queue's LRU
  head is taken (``prefix_cache``);
- step time from the profile's step model (``lbbench.step_model``, e.g.
  ``base + a*prefill_tokens + b*decode_seqs + c*context_tokens``), where the
  context is the KV read by the decoding sequences.

Speed: a step whose batch is *pure decode* with nothing admissible does not
change composition until a request finishes, a KV block allocation would fail,
or something arrives. Such runs of steps are simulated as one *segment* in O(1)
(plus O(block_size) for the block demand): a decoding request's counts follow
the instance's step ``clock`` (``generated = g0 + clock - c0``), block demand
follows a histogram of ``num_computed mod block_size``, step times form an
arithmetic series, and finishes come from a heap keyed by finish clock.

Per request the instance keeps the clock ranges in which it produced tokens;
with the log of step end times that gives exact TTFT and every inter-token gap.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import deque
from itertools import accumulate
from typing import Callable

import numpy as np

from ..core import Event, Failed, Finished, FirstToken, Preempted, Request, StepsAdvanced
from ..profiles import Profile
from ..priority import request_priority
from .prefix_cache import PrefixCache, block_keys

INSTANCE_SCHEDULERS = ("fcfs", "bin_packing", "least_work_left", "priority")


class SimRequest:
    """Engine-side state of one request."""

    __slots__ = ("request", "rid", "prompt_tokens", "output_tokens", "num_computed",
                 "generated", "blocks", "decoding", "c0", "g0", "key", "ranges", "num_preemptions",
                 "first_token_s", "finish_s", "version", "expected", "extra_times",
                 "keys", "held", "n_reg", "own_entry", "n_named_prev", "cached_tokens", "hit_memo")

    def __init__(self, request: Request):
        self.request = request
        self.rid = request.request_id
        self.prompt_tokens = request.prompt_tokens
        self.output_tokens = request.output_tokens
        self.expected = request.expected_output_tokens
        self.num_computed = 0  # valid while not decoding
        self.generated = 0  # valid while not decoding
        self.blocks = 0  # valid while not decoding
        self.decoding = False
        self.c0 = 0
        self.g0 = 0
        self.key = 0
        self.ranges: list[tuple[int, int]] = []  # [first clock, last clock] with a token at each end
        self.num_preemptions = 0
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.version = 0
        self.extra_times: list[float] | None = None  # tokens of V0 prefill-only steps (off the decode clock)
        # prefix caching (see prefix_cache.py)
        self.keys: list[int] = []  # block keys its prefix hashes name
        self.held: list[int] = []  # keys of the cached blocks it holds
        self.n_reg = 0  # leading keys considered for caching so far
        self.own_entry: int | None = None  # free-queue group of its own blocks, after a preemption
        self.n_named_prev = -1
        self.cached_tokens: int | None = None  # prompt tokens reused at its first admission
        self.hit_memo: tuple | None = None  # (cache version, Hit) of its last lookup

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated


class SimInstance:
    """A vLLM-like engine driven by ``add`` and ``advance`` in virtual time."""

    def __init__(self, profile: Profile, index: int = 0, scheduler: str = "fcfs",
                 chunked_prefill: bool | None = None, check_invariants: bool = False,
                 skip_ahead: bool = True, prefix_caching: bool | None = None):
        if scheduler not in INSTANCE_SCHEDULERS:
            raise ValueError(f"instance_schedulers: unknown {scheduler!r} "
                             f"(choose from {', '.join(INSTANCE_SCHEDULERS)})")
        self.profile = profile
        self.index = index
        self.scheduler = scheduler
        self.chunked_prefill = profile.chunked_prefill if chunked_prefill is None else chunked_prefill
        self.check_invariants = check_invariants
        self.skip_ahead = skip_ahead  # False: one step per segment (reference for tests)
        p = profile
        self.bs = p.block_size
        self.num_blocks = p.num_kv_blocks
        self.max_num_seqs = p.max_num_seqs
        self.budget = p.max_num_batched_tokens if self.chunked_prefill else max(
            p.max_num_batched_tokens, p.max_model_len)
        self.max_model_len = min(p.max_model_len, self.num_blocks * self.bs)
        # V0 without chunked prefill: prefill-only and decode-only steps; admission keeps a 1 % watermark
        self.v0 = p.scheduler == "v0" and not self.chunked_prefill
        self.watermark_blocks = int(0.01 * self.num_blocks) if self.v0 else 0
        #: every step time goes through the profile's step model (``lbbench.step_model``); a pure-decode step's
        #: cost without its context term, tabulated once per batch size (a decoding batch never exceeds
        #: ``max_num_seqs``)
        self.step_model = sm = p.step_model
        self._decode_s = tuple(sm.decode_s(n) for n in range(self.max_num_seqs + 1))
        self._c = sm.context_token_s
        if prefix_caching is None:
            prefix_caching = p.enable_prefix_caching
        self.cache: PrefixCache | None = PrefixCache(self.num_blocks, self.bs) if prefix_caching else None

        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.reqs: dict[int, SimRequest] = {}
        self.rejected: dict[int, SimRequest] = {}  # failed at admission, until collected
        self.used_blocks = 0
        self.clock = 0
        self.num_preemptions = 0
        # decoding aggregates
        self.n_dec = 0
        self.hist = [0] * self.bs  # counts of (num_computed - clock) mod bs
        self.sum_key = 0  # sum of (num_computed - clock) over decoding requests
        self.heap: list[tuple[int, int, int]] = []  # (finish clock, rid, version)
        # step end times, ends[k-1] = end of step k
        self._ends = np.empty(4096)
        # the segment in progress
        self.seg_t0 = 0.0
        self.seg_k = 0  # planned steps; 0 = idle
        self.seg_end = 0.0  # when the segment's last step ends: seg_t0 + _cum(seg_k), kept with seg_k
        self.seg_a = 0.0
        self.seg_b = 0.0
        self.seg_sched: list[tuple[SimRequest, int]] | None = None  # slow step: (request, tokens)
        self.seg_prefill_only = False  # V0: the step in progress prefills only (decodes paused)
        self.now_s = 0.0  # time of the last step boundary

    # ------------------------------------------------------------------ public API
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.num_blocks

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Share of prompt tokens reused from the cache at first admission (None: caching off)."""
        return self.cache.hit_rate if self.cache is not None else None

    def generated_tokens(self, rid: int) -> int:
        r = self.reqs[rid]
        return r.g0 + self.clock - r.c0 if r.decoding else r.generated

    def is_decoding(self, rid: int) -> bool:
        r = self.reqs.get(rid)
        return r is not None and r.decoding

    def segment_progress(self, now_s: float) -> tuple[int, float | None]:
        """Inside the segment in progress: how many of its steps have ended by
        ``now_s`` (each decoding request has that many more tokens than
        ``generated_tokens`` says), and when the next of its steps ends. A
        real-time emulator streams tokens step by step from this; the
        simulator itself only materializes whole segments."""
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
        if self.cache is not None:
            r.keys = block_keys(request, self.bs)
        self.waiting.append(r)
        if self.seg_k == 0:
            self.now_s = max(self.now_s, now_s)
            self._plan(events)
        else:
            # the step in progress at now_s runs with the old batch; re-plan at its end
            m = self._steps_done_by(now_s - self.seg_t0)
            if m + 1 < self.seg_k:
                self.seg_k = k = m + 1
                self.seg_end = self.seg_t0 + (k * self.seg_a + self.seg_b * k * (k - 1) * 0.5)
        return events

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

    def abort(self, rid: int) -> None:
        """Remove a request (client went away); frees its blocks."""
        r = self.reqs.pop(rid, None)
        if r is None:
            return
        if r in self.waiting:
            self.waiting.remove(r)
        elif r in self.running:
            self._free(r)
            self.running.remove(r)

    # ------------------------------------------------------------------ timing helpers
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

    # ------------------------------------------------------------------ decoding bookkeeping
    def _start_decoding(self, r: SimRequest, off_clock_s: float | None = None) -> None:
        """``r`` just produced a token at the end of step ``self.clock``, or, from a
        V0 prefill-only step that did not advance the clock, at ``off_clock_s``."""
        clock = self.clock
        r.decoding = True
        r.c0 = clock
        r.g0 = g = r.generated
        r.key = key = r.num_computed - clock
        self.n_dec += 1
        self.hist[key % self.bs] += 1
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
        """Freeze the counters of a decoding request (before preemption or finish)."""
        clock = self.clock
        key = r.key
        r.generated = r.g0 + (clock - r.c0)
        r.num_computed = n = key + clock
        r.blocks = -(-n // self.bs)
        r.decoding = False
        self.n_dec -= 1
        self.hist[key % self.bs] -= 1
        self.sum_key -= key
        r.version += 1
        ranges = r.ranges
        ranges[-1] = (ranges[-1][0], clock)

    def _free(self, r: SimRequest, preempted: bool = False) -> None:
        if r.decoding:
            self._stop_decoding(r)
        cache = self.cache
        if cache is None:
            self.used_blocks -= r.blocks
        else:
            cache.settle(self.num_blocks - self.used_blocks)
            self.used_blocks -= cache.release(r, r.num_computed // self.bs, r.blocks, preempted)
        r.blocks = 0

    def _preempt(self, r: SimRequest, now_s: float, events: list[Event]) -> None:
        self._free(r, preempted=True)
        self.running.remove(r)
        r.num_computed = 0
        r.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(r)
        events.append(Preempted(r.rid, self.index, now_s))

    # ------------------------------------------------------------------ scheduling
    def _pick_waiting(self) -> SimRequest:
        if self.scheduler == "fcfs" or len(self.waiting) == 1:
            return self.waiting[0]
        if self.scheduler == "least_work_left":
            return min(self.waiting, key=lambda r: r.expected - r.generated)
        if self.scheduler == "priority":  # vLLM's priority policy: (priority, arrival) first
            return min(self.waiting, key=self._priority_key)
        # bin_packing: the largest request that fits in free memory, FCFS among ties
        free_tokens = (self.num_blocks - self.used_blocks) * self.bs
        best = None
        best_size = -1
        for r in self.waiting:
            size = r.num_tokens
            if size <= free_tokens and size > best_size:
                best, best_size = r, size
        return best if best is not None else self.waiting[0]

    #: the priority policy's source of a request's priority (default: its predicted
    #: work, ``lbbench.priority``); an emulated server sets it to what the
    #: client sent in the request's ``priority`` field
    priority_of: Callable[[Request], int] | None = None

    def _priority_key(self, r: SimRequest) -> tuple[int, float, int]:
        """vLLM's priority order: the request's priority, then arrival."""
        prio = self.priority_of(r.request) if self.priority_of is not None else request_priority(
            r.request, self.profile)
        return (prio, r.request.arrival_s, r.rid)

    def _victim(self, first: int) -> SimRequest:
        """The running request to preempt: the newest, or under the priority
        policy the one with the largest (priority, arrival), as vLLM does. Only
        requests not yet scheduled in this step (``running[first:]``, the one
        that needs the block included) are candidates, so a step never takes
        back what it already handed out."""
        if self.scheduler == "priority":
            return max(self.running[first:], key=self._priority_key)
        return self.running[-1]

    def _plan(self, events: list[Event]) -> None:
        """Schedule the next step at ``self.now_s`` and decide how many steps it repeats.

        Decoding requests are not listed in the schedule: they follow the step
        clock. ``seg_sched`` holds only the prefill work of the step.
        """
        running = self.running
        waiting = self.waiting
        if not running and not waiting:
            self.seg_k = 0
            return
        t = self.now_s
        self.seg_prefill_only = False
        bs = self.bs
        if waiting and self.v0:
            if self.scheduler == "fcfs" and self.cache is None:
                # the usual outcome under load, decided without _admit: the head of the queue does not fit (the
                # same tests as _admit's first iteration, which would break there)
                r = waiting[0]
                need = r.prompt_tokens + r.generated - r.num_computed
                if not (len(running) >= self.max_num_seqs or need > self.budget
                        or -(-(r.num_computed + need) // bs) - r.blocks
                        > self.num_blocks - self.used_blocks - (self.watermark_blocks if running else 0)):
                    if self._plan_prefill_only(t):
                        return
            elif self._plan_prefill_only(t):
                return
        clock = self.clock
        n = self.n_dec
        demand = self.hist[(-clock) % bs] if n else 0
        if n == len(running) and demand <= self.num_blocks - self.used_blocks:
            # common case: every running request decodes and their new blocks fit
            self.used_blocks += demand
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
                # nothing fits (every waiting request needs more than is free and nothing runs)
                self.seg_k = 0
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
                            k = min(fc - clock, self._max_alloc_steps())
                        break
                c = self._c
                self.seg_a = a = self._decode_s[n] + c * (self.sum_key + n * clock + n)
                self.seg_b = b = c * n
                self.seg_sched = None
                self.seg_t0 = t
                self.seg_k = k
                self.seg_end = t + (k * a + b * k * (k - 1) * 0.5)
                if self.check_invariants:
                    self._assert_invariants([])
                return
        decode_a = self._decode_s[n] + self._c * (self.sum_key + n * clock + n)
        self.seg_a = decode_a + self.step_model.prefill_s([(r.num_computed, need) for r, need in sched or ()], n)
        self.seg_b = 0.0
        self.seg_sched = sched if sched is not None else []
        self.seg_t0 = t
        self.seg_k = 1
        self.seg_end = t + (self.seg_a + self.seg_b * 0 * 0.5)  # seg_t0 + _cum(1)
        if self.check_invariants:
            self._assert_invariants(self.seg_sched)

    def _admit(self, budget: int, reserve_blocks: int, sched: list[tuple[SimRequest, int]]) -> None:
        """Move waiting requests (in scheduler order) to running while the token
        budget, ``max_num_seqs`` and the free blocks beyond ``reserve_blocks``
        allow; a prompt larger than the budget is chunked only with chunked
        prefill. Appends ``(request, tokens)`` to ``sched``."""
        bs = self.bs
        cache = self.cache
        waiting, running = self.waiting, self.running
        fcfs = self.scheduler == "fcfs"
        if cache is None and fcfs:  # the loop below without the cache's steps (V0's prefill-only steps, hot)
            max_seqs, num_blocks, chunked = self.max_num_seqs, self.num_blocks, self.chunked_prefill
            while waiting and budget > 0 and len(running) < max_seqs:
                r = waiting[0]
                computed = r.num_computed
                need = r.prompt_tokens + r.generated - computed
                if need > budget:
                    if not chunked:
                        break
                    need = budget
                grow = -(-(computed + need) // bs) - r.blocks
                if grow > num_blocks - self.used_blocks - reserve_blocks:
                    break
                waiting.popleft()
                running.append(r)
                self.used_blocks += grow
                r.blocks += grow
                sched.append((r, need))
                budget -= need
            return
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            r = waiting[0] if fcfs else self._pick_waiting()
            hit = None
            computed, held, taken = r.num_computed, r.blocks, 0
            if cache is not None and computed == 0 and (r.keys or r.own_entry is not None):
                cache.settle(self.num_blocks - self.used_blocks)
                hit = cache.peek(r)
                computed, held, taken = hit.blocks * bs, hit.blocks, hit.from_free
            need = r.prompt_tokens + r.generated - computed
            if need > budget:
                if not self.chunked_prefill:
                    break
                need = budget
            grow = -(-(computed + need) // bs) - held
            if grow + taken > self.num_blocks - self.used_blocks - reserve_blocks:
                break
            if r is waiting[0]:
                waiting.popleft()
            else:
                waiting.remove(r)
            running.append(r)
            if hit is not None:
                cache.acquire(r, hit)  # type: ignore[union-attr]
                r.num_computed, r.blocks = computed, held
                self.used_blocks += taken
            elif cache is not None and computed == 0:
                cache.count_miss(r)
            self.used_blocks += grow
            r.blocks += grow
            if cache is not None and r.keys:  # the new blocks came off the free queue's head first
                cache.settle(self.num_blocks - self.used_blocks)
                cache.register(r, (computed + need) // bs)
            sched.append((r, need))
            budget -= need

    def _plan_prefill_only(self, t: float) -> bool:
        """V0: admit waiting requests (scheduler order) whose whole prompt fits the
        budget and the free blocks above the watermark; if any, the step prefills
        only them. Returns whether such a step was planned. (In the FCFS, no-cache case ``_plan``
        calls it only when the head of the queue fits.)"""
        reserve = self.watermark_blocks if self.running else 0
        sched: list[tuple[SimRequest, int]] = []
        self._admit(self.budget, reserve, sched)
        if not sched:
            return False
        self.seg_a = self._decode_s[0] + self.step_model.prefill_s([(r.num_computed, need) for r, need in sched], 0)
        self.seg_b = 0.0
        self.seg_sched = sched
        self.seg_prefill_only = True
        self.seg_t0 = t
        self.seg_k = 1
        self.seg_end = t + (self.seg_a + self.seg_b * 0 * 0.5)  # seg_t0 + _cum(1)
        if self.check_invariants:
            self._assert_invariants(sched)
        return True

    def _schedule_running(self, t: float, events: list[Event], sched: list[tuple[SimRequest, int]]) -> bool:
        """General case: walk the running requests in admission order, allocating
        blocks and preempting the newest when they run out. Budget is reserved for
        the decoding requests so that every one of them advances each step (a
        partially prefilled request never starves a decode; vLLM reaches the same
        result by ordering). Returns whether anything was preempted."""
        bs = self.bs
        running = self.running
        clock = self.clock
        num_blocks = self.num_blocks
        if self.n_dec == len(running) and self.scheduler != "priority":
            # every running request decodes (no budget question): only those at a block boundary need a block; the
            # newest requests are preempted, one at a time, when none is free. The victims are the tail of the list,
            # so once one of the requests that need a block was preempted, every later one was too.
            at = (-clock) % bs
            preempted = False
            for r in [r for r in running if r.key % bs == at]:
                if not r.decoding:  # preempted as a victim already
                    break
                while self.used_blocks >= num_blocks:
                    victim = running[-1]
                    preempted = True
                    self._preempt(victim, t, events)
                    if victim is r:
                        break
                else:
                    self.used_blocks += 1
                    continue
                break  # r itself was preempted: it was the last one
            return preempted
        budget = self.budget
        preempted = False
        dec_left = self.n_dec
        cache = self.cache
        i = 0
        while i < len(running):
            r = running[i]
            if r.decoding:
                dec_left -= 1
                if (r.key + clock) % bs:  # its next token fits in the blocks it holds
                    budget -= 1
                    i += 1
                    continue
                need = grow = 1
            else:
                need = min(r.num_tokens - r.num_computed, budget - dec_left)
                if need <= 0:
                    i += 1
                    continue
                grow = -(-(r.num_computed + need) // bs) - r.blocks
            while grow > num_blocks - self.used_blocks:
                victim = self._victim(i)
                preempted = True
                if victim.decoding and victim is not r:
                    dec_left -= 1
                self._preempt(victim, t, events)
                if victim is r:
                    break
            else:
                self.used_blocks += grow
                if not r.decoding:
                    r.blocks += grow
                    sched.append((r, need))
                    if cache is not None and r.keys:
                        cache.settle(num_blocks - self.used_blocks)
                        cache.register(r, (r.num_computed + need) // bs)
                budget -= need
                i += 1
                continue
            # r itself was preempted; the list shrank, continue at the same index
        return preempted

    def _peek_finish(self) -> int:
        heap = self.heap
        while heap:
            fc, rid, ver = heap[0]
            r = self.reqs.get(rid)
            if r is None or r.version != ver or not r.decoding:
                heapq.heappop(heap)
                continue
            return fc
        return self.clock + 1

    def _max_alloc_steps(self) -> int:
        """Largest k such that the block demand of steps 2..k (step 1 is already
        allocated) fits in the free blocks."""
        free = self.num_blocks - self.used_blocks
        n = self.n_dec
        if n == 0:
            return 1 << 30
        bs = self.bs
        full = free // n  # whole cycles of bs steps (each cycle needs one block per decoding request)
        k = 1 + full * bs
        free -= full * n  # < n: the next cycle does not fit
        # demand of step k+1 starts at clock c + k: hist[(c + k) mod bs], hist[(c + k + 1) mod bs]... counted
        # backwards; the steps that still fit are those whose running sum of demand stays within the free blocks
        h = self.hist
        p = (-(self.clock + k)) % bs + bs
        return k + bisect_right(list(accumulate((h + h)[p:p - bs:-1])), free)

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
                if sched is None:
                    # block demand of steps 2..k of a pure-decode segment
                    bs = self.bs
                    hist = self.hist
                    full = (k - 1) // bs
                    demand = full * self.n_dec if full else 0
                    j = 1 + full * bs
                    if k - j > 2:  # the rest of a cycle: a slice of the histogram, counted backwards
                        p = (-(clock + j)) % bs + bs
                        demand += sum((hist + hist)[p:p - (k - j):-1])
                    else:
                        for j in range(j, k):
                            demand += hist[(-(clock + j)) % bs]
                    self.used_blocks += demand
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
            assert 0 <= self.used_blocks <= self.num_blocks, self.used_blocks
            assert len(self.running) <= self.max_num_seqs

    # hook for the cluster to collect finished requests
    _on_finish: Callable[[SimRequest], None] = staticmethod(lambda r: None)

    def token_times(self, r: SimRequest) -> np.ndarray:
        """Times of every token of a finished (or frozen) request."""
        ends = self._ends
        parts = [ends[a - 1:b] for a, b in r.ranges]
        if r.extra_times:
            parts.append(r.extra_times)
            times = np.concatenate(parts)
            times.sort()
            return times
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _assert_invariants(self, sched: list[tuple[SimRequest, int]]) -> None:
        decoding = 0 if self.seg_prefill_only else self.n_dec
        assert decoding + sum(need for _, need in sched) <= self.budget, "token budget exceeded"
        assert 0 <= self.used_blocks <= self.num_blocks, f"blocks out of range {self.used_blocks}"
        assert len(self.running) <= self.max_num_seqs, "max_num_seqs exceeded"
        held = 0
        for r in self.running:
            held += -(-(r.key + self.clock) // self.bs) if r.decoding else r.blocks
        dec_growth = self.hist[(-self.clock) % self.bs] if self.n_dec and not self.seg_prefill_only else 0
        shared = self.cache.num_shared if self.cache is not None else 0
        assert held + dec_growth == self.used_blocks + shared, (held, dec_growth, self.used_blocks, shared)
        if self.cache is not None:
            self.cache.check(self.running, self.num_blocks - self.used_blocks)
        assert self.n_dec == sum(1 for r in self.running if r.decoding)
