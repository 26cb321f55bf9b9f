"""``--workload inference-perf:...``: inference-perf's ``shared_prefix`` traffic at the run's rate and request count.

The requests are ``shared_prefix.shared_prefix_requests``'s (groups x users sharing a system prompt, a question per
user, optional multi-turn chat), sent in one load stage at ``--rate`` until ``--requests`` are out. Keys, with
inference-perf's defaults (``kubernetes-sigs/inference-perf`` ``inference_perf/config/datagen/config.py``
``SharedPrefix``, and ``LoadType.CONSTANT`` in ``inference_perf/config/loadgen/config.py``, commit
``7de5ef2ed6f7934e0ecbc8297e593f79e68430c0``, Apache-2.0):

==============  =======  ===============================================================
key             default  meaning
==============  =======  ===============================================================
``groups``      10       distinct system prompts (``num_groups``)
``users``       10       prompts (users) per system prompt (``num_prompts_per_group``)
``system``      100      system prompt tokens
``question``    50       question tokens
``output``      50       output tokens of every request
``multi_turn``  0        1: multi-turn chat (a user re-sends its context every round)
``user_lock``   0        1, with multi_turn: a user's next round waits for its previous one
``arrival``     constant ``constant`` (evenly spaced) or ``poisson``
``block``       16       tokens per prefix hash (vLLM's block size)
``scale``       1.0      stretch both prompt parts (re-tokenized text comes back longer)
==============  =======  ===============================================================

Example: ``inference-perf:groups=10,users=10,system=100,question=466,output=247,multi_turn=1``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core import Request
from .shared_prefix import ARRIVALS, SharedPrefixSpec, Stage, shared_prefix_requests
from .spec import check, parse_spec

NAMES = ("inference-perf",)


@dataclass(frozen=True)
class InferencePerfSpec:
    groups: int = 10
    users: int = 10
    system: int = 100
    question: int = 50
    output: int = 50
    multi_turn: bool = False
    user_lock: bool = False
    arrival: str = "constant"
    block: int = 16
    scale: float = 1.0

    def shared_prefix(self) -> SharedPrefixSpec:
        return SharedPrefixSpec(self.groups, self.users, self.system, self.question, self.output,
                                multi_turn=self.multi_turn, user_lock=self.user_lock, block_tokens=self.block,
                                prompt_scale=self.scale)


def parse_inference_perf_spec(text: str) -> InferencePerfSpec:
    spec = parse_spec(text, NAMES, InferencePerfSpec)
    check(text, [(spec.groups >= 1, "groups must be >= 1"), (spec.users >= 1, "users must be >= 1"),
                 (spec.system >= 0 and spec.question >= 0 and spec.system + spec.question >= 1,
                  "system and question must be >= 0 and not both 0"),
                 (spec.output >= 1, "output must be >= 1"), (spec.block >= 1, "block must be >= 1"),
                 (spec.scale > 0, "scale must be > 0"),
                 (spec.arrival in ARRIVALS, f"arrival must be one of {', '.join(ARRIVALS)}"),
                 (not spec.user_lock or spec.multi_turn, "user_lock needs multi_turn=1")])
    return spec


def inference_perf_requests(text: str, num_requests: int, rate_per_s: float, seed: int) -> list[Request]:
    """``num_requests`` requests of the spec ``text``, sent at ``rate_per_s`` (one stage), ids ``0..n-1``."""
    spec = parse_inference_perf_spec(text)
    duration_s = num_requests / rate_per_s
    if spec.arrival == "poisson":  # a longer stage, cut at num_requests: Poisson counts vary around rate x duration
        duration_s *= 1.5
        duration_s += 20.0 / rate_per_s
    reqs, _ = shared_prefix_requests(spec.shared_prefix(), [Stage(rate_per_s, duration_s, spec.arrival)], seed)
    return reqs[:num_requests]
