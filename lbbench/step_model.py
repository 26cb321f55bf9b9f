"""The step-time seam: what one engine step costs, asked in the three terms the simulator needs.

An engine step runs ``num_decode`` decoding sequences (one token each, each reading its KV context) and the
prefill chunks scheduled beside them. The simulated instance (``lbbench.sim``) computes every step time
through one ``StepModel``, which a profile builds (``Profile.step_model``):

- ``decode_s(num_decode)``: a step with ``num_decode`` decoding sequences and no prefill, the KV context read
  aside. Any function of ``num_decode`` (a model may memoize it per batch size; the instance itself tabulates
  it once for ``0..max_num_seqs``);
- ``context_token_s``: the cost per KV token read by the decoding sequences. One constant, so that the
  context term of a run of pure-decode steps grows linearly and the run's step times stay an arithmetic
  series (the simulator advances such runs in O(1));
- ``prefill_s(chunks, num_decode)``: the extra cost of the prefill chunks scheduled in a step, ``chunks``
  holding one ``(tokens computed before this chunk, chunk tokens)`` pair per request prefilled in the step.

So a mixed step costs ``decode_s(n) + context_token_s * context_tokens + prefill_s(chunks, n)``, in that
order, and a prefill-only step (vLLM V0's) ``decode_s(0) + prefill_s(chunks, 0)``. Loads from a CPU KV tier
and KV transfers are no step term: they run beside the steps, on their own link
(``lbbench.sim.offload``).

Two models implement it: ``lbbench.roofline.RooflineStepModel`` (physics: a roofline per kernel group, for
``[step] model = "roofline"`` profiles) and ``LinearStepModel``, the paper-era profiles' model, ``base + a*prefill_tokens + b*decode_seqs + c*context_tokens``
(coefficients calibrated or derived per profile, see ``docs/profiles.md``). It computes in exactly the
floating-point order the simulator always used (``base + b*n``, then ``+ c*context``, then ``+ a*tokens``),
so records made through the seam are bit-identical to those made before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Protocol, Sequence, runtime_checkable


@runtime_checkable
class StepModel(Protocol):
    """What a simulated engine step costs (see the module docstring)."""

    #: seconds per KV token read by the decoding sequences of a step
    context_token_s: float

    def decode_s(self, num_decode: int) -> float:
        """Seconds of a step with ``num_decode`` decoding sequences and no prefill, context read aside."""
        ...

    def prefill_s(self, chunks: Sequence[tuple[int, int]], num_decode: int) -> float:
        """Extra seconds of the prefill ``chunks`` (``(computed before, chunk tokens)`` each) in a step with
        ``num_decode`` decoding sequences."""
        ...


@dataclass(frozen=True)
class LinearStepModel:
    """``base_s + prefill_token_s * prefill_tokens + decode_seq_s * num_decode + context_token_s *
    context_tokens``: a step's cost is linear in its prefill tokens, its decoding sequences and the KV they
    read, whatever the chunks' prior context."""

    base_s: float
    prefill_token_s: float
    decode_seq_s: float
    context_token_s: float

    def decode_s(self, num_decode: int) -> float:
        return self.base_s + self.decode_seq_s * num_decode

    def prefill_s(self, chunks: Sequence[tuple[int, int]], num_decode: int) -> float:
        return self.prefill_token_s * sum(map(itemgetter(1), chunks))


def step_s(model: StepModel, prefill_tokens: int, num_decode: int, context_tokens: int) -> float:
    """One step of ``model``: ``num_decode`` decoding sequences reading ``context_tokens`` of KV, beside one
    fresh prefill chunk of ``prefill_tokens`` (nothing computed before it; no chunk when 0)."""
    chunks = ((0, prefill_tokens),) if prefill_tokens else ()
    return model.decode_s(num_decode) + model.context_token_s * context_tokens + model.prefill_s(chunks, num_decode)
