"""Engine-side state of one request in a simulated instance, split by owner as vLLM v1 splits it.

The scheduler (``scheduler.py``, vLLM's ``Scheduler``) owns the token counts and the request's place in the
step clock; the KV block manager (``block_manager.py``, vLLM's ``KVCacheManager``) owns the request's blocks:
how many it holds, the prefix-cache keys its blocks carry and which cached blocks it holds. Each side writes
only its own slots; the slots live on one object so that the hot path reads them without a second lookup.
"""

from __future__ import annotations

from ..core import Request


class SimRequest:
    """One request inside a simulated instance."""

    __slots__ = (
        # scheduler
        "request", "rid", "prompt_tokens", "output_tokens", "expected", "num_computed", "generated",
        "decoding", "c0", "g0", "key", "version", "ranges", "extra_times", "num_preemptions",
        "first_token_s", "finish_s", "eligible_clock",
        # KV block manager
        "blocks", "keys", "held", "n_reg", "own_entry", "n_named_prev", "cached_tokens", "hit_memo", "n_stored",
        "n_loading")

    def __init__(self, request: Request):
        self.request = request
        self.rid = request.request_id
        self.prompt_tokens = request.prompt_tokens
        self.output_tokens = request.output_tokens
        self.expected = request.expected_output_tokens
        self.num_computed = 0  # tokens whose KV is computed; valid while not decoding
        self.generated = 0  # valid while not decoding
        self.decoding = False
        # while decoding, counts follow the instance's step clock: generated = g0 + clock - c0,
        # num_computed = key + clock
        self.c0 = 0
        self.g0 = 0
        self.key = 0
        self.version = 0  # bumped at every decode start/stop (stale finish-heap entries are skipped)
        self.ranges: list[tuple[int, int]] = []  # [first clock, last clock] with a token at each end
        self.extra_times: list[float] | None = None  # tokens made off the decode clock (V0 prefill-only steps)
        self.num_preemptions = 0
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.eligible_clock = 0  # async scheduling: the step clock from which the scheduler can see it
        # the block manager's (see block_manager.py and prefix_cache.py)
        self.blocks = 0  # blocks held; valid while not decoding (then ceil(num_computed / block_size))
        self.keys: list[int] = []  # block keys its prefix hashes name
        self.held: list[int] = []  # keys of the cached blocks it holds
        self.n_reg = 0  # leading keys considered for caching so far
        self.own_entry: int | None = None  # free-queue group of its own blocks, after a preemption
        self.n_named_prev = -1
        self.cached_tokens: int | None = None  # prompt tokens reused at its first admission
        self.hit_memo: tuple | None = None  # (cache version, Hit) of its last lookup
        self.n_stored = 0  # leading keyed blocks stored in the CPU tier so far (offload.py)
        self.n_loading = 0  # blocks being loaded from the CPU tier, after its GPU hit

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated
