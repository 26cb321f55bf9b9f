"""inference-perf's ``shared_prefix`` workload: groups of users sharing a system prompt, sent in load stages.

What kubernetes-sigs/inference-perf generates (``inference_perf/datagen/shared_prefix_datagen.py``,
``inference_perf/apis/user_session.py``; Apache-2.0), and lbbench reproduces as requests:

- ``num_groups`` random system prompts of ``system_prompt_tokens`` tokens, and for each group
  ``prompts_per_group`` random questions of ``question_tokens`` tokens: ``num_groups x prompts_per_group``
  prompts in all, every answer ``output_tokens`` long (``ignore_eos``);
- request ``i`` (counted over every stage) uses prompt ``i mod N``: each prompt comes back every ``N`` requests;
- single turn: the prompt is the group's system prompt followed by the question (the prompts are shuffled once);
- multi-turn chat (``enable_multi_turn_chat``): ``N`` user sessions, each holding one group's system prompt as its
  context (the sessions are shuffled once, so a session's system prompt and its question's group are paired at
  random), and request ``i`` belongs to user ``i mod N``. Recent inference-perf holds a per-user lock, so that a
  user's next request waits for its previous one (``user_lock``: a closed-loop session here, ``session_id`` and
  ``turn``); the measured runs this workload is checked against did not (inference-sim's vLLM 0.15.1 experiments:
  23 users at 1 request/s with a mean E2E of 40.8 s had about 41 requests in flight, more than there were users),
  so it is off by default. The context does not grow either: in those runs (30+ rounds per user at
  ``max_model_len`` 4,096) the prompt lengths stay within 580-604 tokens and no request failed, so every round of a
  user sends the same prompt;
- load stages: ``constant`` (evenly spaced) or ``poisson`` arrivals at each stage's rate for its duration, one
  stage after the other.

Prompt tokens are named by ``prefix_hashes`` over ``block_tokens``-token blocks (vLLM's 16 by default): a block
wholly inside the system prompt is named by the group, any other by the prompt, and only full blocks of the
prompt are named (the last partial block is never a cache hit). ``prompt_scale`` stretches both parts (the
measured prompt lengths run a few percent above the nominal ones: random token ids decoded to text and
re-tokenized by the server's tokenizer come back longer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import Request
from .errors import WorkloadError

ARRIVALS = ("constant", "poisson")


@dataclass(frozen=True)
class SharedPrefixSpec:
    num_groups: int
    prompts_per_group: int
    system_prompt_tokens: int
    question_tokens: int
    output_tokens: int
    multi_turn: bool = False
    #: multi-turn only: a user's next request waits until its previous one finished
    user_lock: bool = False
    block_tokens: int = 16
    prompt_scale: float = 1.0

    def check(self, what: str = "shared_prefix") -> None:
        for name in ("num_groups", "prompts_per_group", "output_tokens", "block_tokens"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"{what}: {name} must be >= 1")
        if self.system_prompt_tokens < 0 or self.question_tokens < 0 or (
                self.system_prompt_tokens + self.question_tokens) < 1:
            raise WorkloadError(f"{what}: system_prompt_tokens and question_tokens must be >= 0 and not both 0")
        if not self.prompt_scale > 0:
            raise WorkloadError(f"{what}: prompt_scale must be > 0")

    @property
    def num_prompts(self) -> int:
        return self.num_groups * self.prompts_per_group


@dataclass(frozen=True)
class Stage:
    rate_per_s: float
    duration_s: float
    arrival: str = "constant"

    def check(self, what: str = "stage") -> None:
        if self.arrival not in ARRIVALS:
            raise WorkloadError(f"{what}: arrival {self.arrival!r}: choose from {', '.join(ARRIVALS)}")
        if not self.rate_per_s > 0 or not self.duration_s > 0:
            raise WorkloadError(f"{what}: rate and duration must be > 0")


def stage_arrivals(stages: list[Stage], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Send times of every request and the stage index of each, stages back to back."""
    times, which = [], []
    t0 = 0.0
    for k, st in enumerate(stages):
        st.check(f"stage {k}")
        if st.arrival == "constant":
            n = int(round(st.rate_per_s * st.duration_s))
            t = t0 + np.arange(n) / st.rate_per_s
        else:
            gaps = rng.exponential(1.0 / st.rate_per_s, size=int(st.rate_per_s * st.duration_s * 1.5) + 16)
            t = t0 + np.cumsum(gaps) - gaps[0]
            t = t[t < t0 + st.duration_s]
        times.append(t)
        which.append(np.full(len(t), k))
        t0 += st.duration_s
    return np.concatenate(times), np.concatenate(which)


def _hash(*parts: int) -> int:
    return hash(parts) & 0x3FFFFFFFFFFFFFFF


def shared_prefix_requests(spec: SharedPrefixSpec, stages: list[Stage], seed: int = 0,
                           first_id: int = 0) -> tuple[list[Request], np.ndarray]:
    """The requests of every stage, in send order, and the stage index of each."""
    spec.check()
    rng = np.random.default_rng(seed)
    send_s, stage = stage_arrivals(stages, rng)
    n_prompts = spec.num_prompts
    sys_tokens = int(round(spec.system_prompt_tokens * spec.prompt_scale))
    q_tokens = int(round(spec.question_tokens * spec.prompt_scale))
    prompt_tokens = sys_tokens + q_tokens
    # which group's system prompt each prompt (single turn) or user session (multi-turn) carries
    group_of = np.repeat(np.arange(spec.num_groups), spec.prompts_per_group)
    group_of = rng.permutation(group_of)
    bs = spec.block_tokens
    hashes_of = []
    for p in range(n_prompts):
        g = int(group_of[p])
        hashes_of.append(tuple(_hash(1, seed, g, j) if (j + 1) * bs <= sys_tokens else _hash(2, seed, p, j)
                               for j in range(prompt_tokens // bs)))
    out = []
    for i, t in enumerate(send_s):
        p = i % n_prompts
        out.append(Request(first_id + i, float(t), prompt_tokens, spec.output_tokens, task="shared_prefix",
                           prefix_hashes=hashes_of[p] or None, prefix_block_tokens=bs,
                           session_id=p if spec.multi_turn and spec.user_lock else None,
                           turn=i // n_prompts if spec.multi_turn and spec.user_lock else None))
    return out, stage
