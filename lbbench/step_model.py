"""How long an engine step takes: the one interface the simulated instance asks, and the linear model.

A simulated instance prices every step through its profile's ``step_model``:

- ``decode_s(num_decode)``: a step of ``num_decode`` decoding sequences and nothing to prefill, the KV read aside;
- ``context_token_s``: the cost of each KV token the decoding sequences read (linear, so that a run of pure-decode
  steps is an arithmetic series and the instance can skip over it in O(1));
- ``prefill_s(chunks, num_decode)``: what the prefill chunks scheduled in a step add to it, each chunk being
  ``(tokens computed before it, tokens in it)``.

A step's time is ``decode_s(n) + context_token_s x context + prefill_s(chunks, n)``. Two models implement it:
:class:`LinearStepModel` (``base + a x prefill_tokens + b x decode_seqs + c x context_tokens``, the paper's
calibrated profiles) and ``lbbench.roofline.RooflineStepModel`` (physics, ``[step] model = "roofline"``).
"""

from __future__ import annotations

from typing import Protocol, Sequence


class StepModel(Protocol):
    context_token_s: float

    def decode_s(self, num_decode: int) -> float: ...

    def prefill_s(self, chunks: Sequence[tuple[int, int]], num_decode: int) -> float: ...


class LinearStepModel:
    """``base_s + prefill_token_s x prefill_tokens + decode_seq_s x decode_seqs + context_token_s x context``,
    evaluated in the order the simulator always used, so that its records do not move by a bit."""

    __slots__ = ("base_s", "prefill_token_s", "decode_seq_s", "context_token_s")

    def __init__(self, base_s: float, prefill_token_s: float, decode_seq_s: float, context_token_s: float):
        self.base_s = base_s
        self.prefill_token_s = prefill_token_s
        self.decode_seq_s = decode_seq_s
        self.context_token_s = context_token_s

    def decode_s(self, num_decode: int) -> float:
        return self.base_s + self.decode_seq_s * num_decode

    def prefill_s(self, chunks: Sequence[tuple[int, int]], num_decode: int) -> float:
        return self.prefill_token_s * sum(c for _, c in chunks)
