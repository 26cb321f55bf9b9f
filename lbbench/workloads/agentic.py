"""Agentic sessions: tool-call loops whose context grows every call, with tool time between calls and sub-agent forks.

A session is one agent working on user turns. Each call's prompt is the agent's whole context so far: the system
head (shared by every agent with the same one of ``prompts`` heads), the user's task, and every earlier call's output
and tool result. In a turn the agent calls a tool ``steps`` times (each call's output is a tool call; the tool's
result is appended after ``tool`` seconds) and then answers; the user's next turn comes ``think`` seconds after the
answer. With probability ``fork`` a turn forks instead: one call dispatches ``k`` sub-agents (``kmin``..``kmax``),
each starting from the context so far and running its own tool loop, then reporting; the reports are appended to
the agent's context and a merge call answers the turn. A session stops at ``max_calls`` calls, or before a call
would outgrow ``max_model_len``.

Defaults follow inference-perf's ``synthetic_agentic`` generator (``kubernetes-sigs/inference-perf``
``docs/synthetic_agentic.md`` and ``inference_perf/datagen/synthetic_agentic.py`` at commit
``5eb6bac3379a5f7526a1d5441b74e74b5a3b30bf``, Apache-2.0): a 1,000-token shared system head
(``shared_system_prompt_len``), tool-loop depth 2, a 1 s tool latency (``tool_call_latency_sec``), 10 s of user
think time, 2-4 sub-agents per spawn, at most 64 calls per session, a task of 600 tokens (lognormal, std 400) and
answers of 40-200 tokens (the docs' minimal example). inference-perf's fan-out probability defaults to 0; lbbench
forks 20 % of turns so that the default exercises branching. Tool-call outputs (80 tokens) and tool results (500
tokens, lognormal CV 1) are lbbench's choices, sized so that contexts grow the way the Mooncake tool-agent trace's
do (``ai-dynamo/dynamo`` ``docs/benchmarks/kv-router-ab-testing.md`` at ``08b41a94614c20a6112e0ec1086f1691d4ab2b2f``:
agents "iteratively call tools and APIs while maintaining a growing conversation context", prompts of 6-9k tokens
sharing most of their 512-token blocks).

Content is named by ``prefix_hashes`` over ``block``-token blocks (16 by default, vLLM's block size): a block inside
the system head is named by the head, any other by the context (agent or sub-agent) it belongs to, and a sub-agent
keeps its parent's names for the blocks wholly inside the context it started from. A call's hashes run on over the
output it will produce, which the next call's prompt repeats.

Timing (``closed``, the default): each agent's calls form a closed-loop session, a call sent when the previous one
finished plus its tool (or think) time, in the simulator and live alike. A session in lbbench is a chain, one
predecessor per call, so a fork's first sub-agent continues the agent's chain and the others are sessions of their
own that start when the generator planned the fork (the dispatching call's nominal finish: its new tokens at the
profile's prefill speed plus its output at the minimum step, the unloaded latency), and the merge call waits for the
first sub-agent and for the planned end of the others. Under load the other sub-agents can therefore start before
their parent's answer is out, and miss its cache. ``closed=0`` sends every call at its planned time (open loop),
which is what a trace of this workload holds (``lbbench trace synth``).

Spec: ``agentic`` or ``agentic:KEY=VALUE,...`` (keys: the fields of ``AgenticSpec``). ``--rate`` is the offered call
rate: sessions start at rate / mean calls per session (Poisson, or bursty with ``--burstiness``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..core import Request
from ..errors import InputError
from .arrivals import arrival_times
from .lengths import LognormalLength
from .spec import check, parse_spec

NAMES = ("agentic",)


@dataclass(frozen=True)
class AgenticSpec:
    system: int = 1000  #: system head tokens, shared by every agent with the same head
    prompts: int = 1  #: distinct system heads
    task: float = 600.0  #: mean tokens of a user turn's task (lognormal, std 2/3 of the mean)
    steps: int = 2  #: tool-loop depth: tool calls per turn before the answer
    call: float = 80.0  #: mean tokens of a tool-call output (lognormal, CV 0.5)
    result: float = 500.0  #: mean tokens of a tool result (lognormal, CV 1)
    answer: float = 120.0  #: mean tokens of an answer or a sub-agent's report (uniform, 1/3 to 5/3 of the mean)
    tool: float = 1.0  #: tool latency between a tool call's end and the next call, seconds
    turns: int = 1  #: user turns per session
    think: float = 10.0  #: user think time before a later turn, seconds
    fork: float = 0.2  #: probability that a turn forks sub-agents
    kmin: int = 2  #: fewest sub-agents per fork
    kmax: int = 4  #: most sub-agents per fork
    max_calls: int = 64  #: calls per session at most
    block: int = 16  #: tokens per prefix hash
    closed: bool = True  #: closed-loop sessions (False: every call at its planned time)


def parse_agentic_spec(text: str) -> AgenticSpec:
    spec = parse_spec(text, NAMES, AgenticSpec)
    check(text, [(spec.system >= 0, "system must be >= 0"), (spec.prompts >= 1, "prompts must be >= 1"),
                 (spec.task >= 1, "task must be >= 1"), (spec.steps >= 0, "steps must be >= 0"),
                 (spec.call >= 1, "call must be >= 1"), (spec.result >= 1, "result must be >= 1"),
                 (spec.answer >= 3, "answer must be >= 3"), (spec.tool >= 0, "tool must be >= 0"),
                 (spec.turns >= 1, "turns must be >= 1"), (spec.think >= 0, "think must be >= 0"),
                 (0 <= spec.fork <= 1, "fork must be in [0, 1]"), (1 <= spec.kmin <= spec.kmax, "need 1 <= kmin <= kmax"),
                 (spec.max_calls >= 1, "max_calls must be >= 1"), (spec.block >= 1, "block must be >= 1")])
    return spec


def _name(kind: int, owner: int, j: int) -> int:
    return hash((kind, owner, j)) & 0x3FFFFFFFFFFFFFFF


class _Context:
    """One agent's (or sub-agent's) token stream and the names of its blocks."""

    def __init__(self, cid: int, block: int, tokens: int, inherited: list[int], computed: int = 0):
        self.id, self.block, self.tokens = cid, block, tokens
        self.inherited = inherited  # names of the leading blocks wholly inside the context it started from
        self.computed = computed  # tokens an earlier call already computed (cached when unloaded)

    def names(self, upto_tokens: int) -> tuple[int, ...]:
        n, k = -(-upto_tokens // self.block), len(self.inherited)
        return tuple(self.inherited[j] if j < k else _name(1, self.id, j) for j in range(n))

    def fork(self, cid: int) -> "_Context":
        return _Context(cid, self.block, self.tokens, list(self.names(self.tokens - self.tokens % self.block)),
                        self.computed)


@dataclass
class _Call:
    """A planned call: its request fields, its session chain and its planned send time."""

    offset_s: float  # planned send time, from the session's start
    prompt: int
    output: int
    hashes: tuple[int, ...]
    chain: int  # which chain of the session (0: the agent's, k > 0: the k-th extra sub-agent)
    think_s: float
    not_before_s: float | None = None  # closed loop: a merge waits for the planned end of the other sub-agents


class _Planner:
    """Plans one session's calls (sizes, hashes, planned times)."""

    def __init__(self, spec: AgenticSpec, rng: np.random.Generator, max_model_len: int, prefill_s_per_token: float,
                 step_s: float, first_context_id: int):
        self.spec, self.rng, self.max_model_len = spec, rng, max_model_len
        self.prefill_s, self.step_s = prefill_s_per_token, step_s
        self.next_id = first_context_id
        self.calls: list[_Call] = []
        self.num_chains = 1
        self.task = LognormalLength.from_mean_cv(spec.task, 2 / 3)
        self.call_len = LognormalLength.from_mean_cv(spec.call, 0.5)
        self.result = LognormalLength.from_mean_cv(spec.result, 1.0)

    def _draw(self, dist: LognormalLength) -> int:
        return max(1, int(dist.sample(self.rng, 1)[0]))

    def _answer(self) -> int:
        a = self.spec.answer
        return int(self.rng.integers(max(1, round(a / 3)), round(5 * a / 3) + 1))

    def _context(self, parent: _Context | None = None) -> _Context:
        self.next_id += 1
        if parent is not None:
            return parent.fork(self.next_id)
        s = self.spec
        head = int(self.rng.integers(s.prompts))
        return _Context(self.next_id, s.block, s.system, [_name(0, head, j) for j in range(s.system // s.block)])

    def call(self, ctx: _Context, output: int, t: float, chain: int, think_s: float) -> float | None:
        """Plan a call of ``ctx`` sent at ``t``; None (nothing planned) when the session is out of calls or the
        context would outgrow the model. Returns the call's planned finish."""
        if len(self.calls) >= self.spec.max_calls or ctx.tokens + output > self.max_model_len:
            return None
        new = max(1, ctx.tokens - ctx.computed)
        self.calls.append(_Call(t, ctx.tokens, output, ctx.names(ctx.tokens + output), chain, think_s))
        ctx.tokens += output
        ctx.computed = ctx.tokens
        return t + 0.05 + new * self.prefill_s + output * self.step_s

    def loop(self, ctx: _Context, t: float, chain: int, think_s: float, final: int) -> tuple[float, bool]:
        """A tool loop and its final call (``final`` tokens); returns its end and whether it completed."""
        for _ in range(self.spec.steps):
            end = self.call(ctx, self._draw(self.call_len), t, chain, think_s)
            if end is None:
                return t, False
            ctx.tokens += self._draw(self.result)
            t, think_s = end + self.spec.tool, self.spec.tool
        end = self.call(ctx, final, t, chain, think_s)
        return (t, False) if end is None else (end, True)

    def session(self) -> None:
        s = self.spec
        ctx = self._context()
        t, think_s = 0.0, 0.0
        for turn in range(s.turns):
            ctx.tokens += self._draw(self.task)
            if self.rng.random() < s.fork:
                end = self.call(ctx, self._draw(self.call_len), t, 0, think_s)  # the dispatching call
                if end is None:
                    return
                k = int(self.rng.integers(s.kmin, s.kmax + 1))
                subs = [self._context(ctx) for _ in range(k)]
                reports, ends = [], []
                for b, sub in enumerate(subs):
                    chain = 0 if b == 0 else self.num_chains
                    self.num_chains += b > 0
                    done_s, ok = self.loop(sub, end, chain, 0.0, self._answer())
                    if ok:
                        reports.append(self.calls[-1].output)
                        ends.append(done_s)
                if not ends or not reports:
                    return
                ctx.tokens += sum(reports)  # the reports come back as tool results
                merge_t = max(ends)
                merged = self.call(ctx, self._answer(), merge_t, 0, 0.0)  # the merge call answers the turn
                if merged is None:
                    return
                if len(subs) > 1:
                    self.calls[-1].not_before_s = merge_t
                t, ok = merged, True
            else:
                t, ok = self.loop(ctx, t, 0, think_s, self._answer())
            if not ok:
                return
            t += s.think
            think_s = s.think


def _plan_calls(spec: AgenticSpec, rng: np.random.Generator, max_model_len: int, prefill_s: float, step_s: float,
                first_id: int) -> _Planner:
    p = _Planner(spec, rng, max_model_len, prefill_s, step_s, first_id)
    p.session()
    return p


def agentic(num_requests: int, rate_per_s: float, seed: int, spec: AgenticSpec | None = None,
            max_model_len: int = 8192, burstiness: float = 1.0, prefill_s_per_token: float = 1e-4,
            step_s: float = 0.02) -> list[Request]:
    """``num_requests`` calls of agentic sessions (ids in arrival order). ``prefill_s_per_token`` and ``step_s``
    plan the unloaded latencies (a profile's ``prefill_token_s`` and ``min_step_s``)."""
    spec = spec or AgenticSpec()
    if spec.system + 2 > max_model_len:
        raise InputError(f"agentic: a system head of {spec.system} tokens leaves no room in max_model_len "
                         f"{max_model_len}", "workload")
    rng_arr, rng_len = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    sessions: list[_Planner] = []
    total, next_id = 0, 0
    while total < num_requests:
        p = _plan_calls(spec, rng_len, max_model_len, prefill_s_per_token, step_s, next_id)
        next_id = p.next_id
        if not p.calls:
            if not sessions and next_id > 1000:
                raise InputError("agentic: no session fits max_model_len "
                                 f"{max_model_len} (system + task + output too long)", "workload")
            continue
        sessions.append(p)
        total += len(p.calls)
    starts = arrival_times(len(sessions), rate_per_s * len(sessions) / total, rng_arr, burstiness)
    planned = sorted(((float(starts[i]) + c.offset_s, i, j) for i, p in enumerate(sessions)
                      for j, c in enumerate(p.calls)))[:num_requests]
    keep: dict[int, list[int]] = {}
    for _, i, j in planned:
        keep.setdefault(i, []).append(j)
    out: list[Request] = []
    chain_base = 0
    for i, p in enumerate(sessions):
        start = float(starts[i])
        turn_of: dict[int, int] = {}
        first_s: dict[int, float] = {}
        for c in p.calls:
            first_s.setdefault(c.chain, c.offset_s)
        for j in sorted(keep.get(i, [])):
            c = p.calls[j]
            at = start + c.offset_s
            if spec.closed:
                sid = chain_base + c.chain
                turn = turn_of[c.chain] = turn_of.get(c.chain, -1) + 1
                first_of_extra = c.chain > 0 and turn == 0
                # a chain's calls are due when it starts (then closed loop); a merge not before the planned end of
                # the other sub-agents
                arrival = start + (c.not_before_s if c.not_before_s is not None else first_s[c.chain])
                out.append(Request(0, arrival, c.prompt, c.output, task="agentic", prefix_hashes=c.hashes,
                                   prefix_block_tokens=spec.block, session_id=sid, turn=turn,
                                   think_s=0.0 if first_of_extra else c.think_s))
            else:
                out.append(Request(0, at, c.prompt, c.output, task="agentic", prefix_hashes=c.hashes,
                                   prefix_block_tokens=spec.block))
        chain_base += p.num_chains
    order = sorted(range(len(out)), key=lambda k: (out[k].arrival_s, out[k].session_id or 0, out[k].turn or 0, k))
    return [replace(out[k], request_id=n) for n, k in enumerate(order)]
