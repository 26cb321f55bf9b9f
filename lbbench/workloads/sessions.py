"""Multi-turn sessions with shared system prompts (a synthetic prefix-sharing workload).

Sessions start as a Poisson (or bursty) process. A session opens with a system
prompt, shared with other sessions (one of ``prompts`` system prompts, for a
share ``share`` of sessions) or its own, then runs a number of turns
(geometric with mean ``turns``, at most ``max_turns``). Turn ``k``'s prompt is
the whole conversation so far: system prompt, every earlier user message and
answer, and the new user message; its answer is ``output`` tokens long. A turn
after the first is sent ``think_s`` seconds (exponential with mean ``think``)
after the previous answer finished: the replay runs them closed loop.

Content is named by ``prefix_hashes`` over blocks of ``block`` tokens of the
conversation's token stream (default 16, vLLM's block size): a block inside the
system prompt is named by that prompt, any other by the session, and a turn's
hashes run on over the answer it will produce, which the next turn repeats.

``rate`` is the offered request rate: sessions start at ``rate / turns`` per
second. A session ends early rather than outgrow ``max_model_len``.

Spec: ``sessions`` or ``sessions:KEY=VALUE,...`` with keys ``system``,
``prompts``, ``share``, ``turns``, ``max_turns``, ``user``, ``output``, ``think``,
``block`` (see ``SessionSpec``); ``shared-prefix`` is ``sessions:turns=1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np

from ..core import Request
from .arrivals import arrival_times
from .errors import WorkloadError
from .lengths import LognormalLength


@dataclass(frozen=True)
class SessionSpec:
    system: int = 1024  #: system prompt tokens
    prompts: int = 8  #: distinct shared system prompts
    share: float = 0.8  #: share of sessions with a shared system prompt (the rest have their own)
    turns: float = 4.0  #: mean turns per session (geometric)
    max_turns: int = 16
    user: float = 128.0  #: mean user message tokens (lognormal, CV 1)
    output: float = 256.0  #: mean answer tokens (lognormal, CV 1)
    think: float = 5.0  #: mean think time between an answer and the next turn, seconds (exponential)
    block: int = 16  #: tokens per prefix hash


def parse_session_spec(text: str, what: str = "workload") -> SessionSpec:
    """``sessions``, ``sessions:turns=6,think=2``, or ``shared-prefix[:...]`` (one turn)."""
    name, _, rest = text.partition(":")
    if name not in ("sessions", "shared-prefix"):
        raise WorkloadError(f"{what}: not a session workload: {text!r}")
    kw: dict[str, float | int] = {"turns": 1.0, "max_turns": 1} if name == "shared-prefix" else {}
    types = {f.name: f.type for f in fields(SessionSpec)}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in types:
            raise WorkloadError(f"{what}: {item!r} in {text!r}: expected KEY=VALUE with KEY one of "
                                f"{', '.join(types)}")
        try:
            kw[key] = int(value) if types[key] == "int" else float(value)
        except ValueError:
            raise WorkloadError(f"{what}: {key}={value!r} is not a number") from None
    spec = SessionSpec(**kw)  # type: ignore[arg-type]
    checks = [(spec.system >= 0, "system must be >= 0"), (spec.prompts >= 1, "prompts must be >= 1"),
              (0 <= spec.share <= 1, "share must be in [0, 1]"), (spec.turns >= 1, "turns must be >= 1"),
              (spec.max_turns >= 1, "max_turns must be >= 1"), (spec.user >= 1, "user must be >= 1"),
              (spec.output >= 1, "output must be >= 1"), (spec.think >= 0, "think must be >= 0"),
              (spec.block >= 1, "block must be >= 1")]
    for ok, msg in checks:
        if not ok:
            raise WorkloadError(f"{what}: {text!r}: {msg}")
    return spec


def _block_hash(kind: int, owner: int, j: int) -> int:
    return hash((kind, owner, j)) & 0x3FFFFFFFFFFFFFFF


def sessions(num_requests: int, rate_per_s: float, seed: int, spec: SessionSpec | None = None,
             max_model_len: int = 8192, burstiness: float = 1.0) -> list[Request]:
    """``num_requests`` requests of multi-turn sessions (ids in order of session start, then turn)."""
    spec = spec or SessionSpec()
    if spec.system + 2 > max_model_len:
        raise WorkloadError(f"workload: system prompt of {spec.system} tokens leaves no room in "
                            f"max_model_len {max_model_len}")
    rng_arr, rng_len, rng_think = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    user_len, out_len = LognormalLength.from_mean_cv(spec.user, 1.0), LognormalLength.from_mean_cv(spec.output, 1.0)
    p_end = 1.0 / spec.turns  # geometric number of turns with this mean
    max_sessions = max(1, int(num_requests))
    starts = arrival_times(max_sessions, rate_per_s / spec.turns, rng_arr, burstiness)
    out: list[Request] = []
    g = spec.block
    for sid in range(max_sessions):
        if len(out) >= num_requests:
            break
        shared = rng_len.random() < spec.share
        sys_id = int(rng_len.integers(spec.prompts)) if shared else -1 - sid
        sys_blocks = spec.system // g  # full blocks inside the system prompt
        context = spec.system
        for turn in range(spec.max_turns):
            user = int(user_len.sample(rng_len, 1)[0])
            answer = int(out_len.sample(rng_len, 1)[0])
            prompt = context + user
            if prompt + answer > max_model_len or len(out) >= num_requests:
                break
            n = math.ceil((prompt + answer) / g)
            hashes = tuple(_block_hash(0, sys_id, j) if j < sys_blocks else _block_hash(1, sid, j)
                           for j in range(n))
            think = float(rng_think.exponential(spec.think)) if turn and spec.think > 0 else 0.0
            out.append(Request(request_id=len(out), arrival_s=float(starts[sid]), prompt_tokens=prompt,
                               output_tokens=answer, task="session", prefix_hashes=hashes,
                               prefix_block_tokens=g, session_id=sid, turn=turn, think_s=think))
            context = prompt + answer
            if rng_len.random() < p_end:
                break
    out.sort(key=lambda r: (r.arrival_s, r.request_id))
    return [replace(r, request_id=i) for i, r in enumerate(out)]
