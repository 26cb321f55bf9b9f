"""The step-time seam: the linear model's hand values and float order, and a simulated instance that takes
every step time from its profile's ``step_model`` (a non-linear model drops in, skip-ahead included)."""

from dataclasses import dataclass, fields

import pytest

from lbbench.core import Finished, FirstToken
from lbbench.profiles import Profile
from lbbench.sim.instance import SimInstance
from lbbench.step_model import LinearStepModel, StepModel, step_s
from factories import req, tiny_profile


def test_linear_model_hand_values():
    m = LinearStepModel(base_s=0.01, prefill_token_s=1e-4, decode_seq_s=2e-3, context_token_s=1e-6)
    assert isinstance(m, StepModel)
    assert m.decode_s(0) == 0.01
    assert m.decode_s(3) == 0.01 + 2e-3 * 3
    assert m.prefill_s([(0, 100), (32, 28)], 3) == 1e-4 * 128  # the prior context does not matter
    assert m.prefill_s([], 5) == 0.0
    assert step_s(m, 100, 2, 500) == pytest.approx(0.01 + 1e-4 * 100 + 2e-3 * 2 + 1e-6 * 500)


def test_linear_model_keeps_the_simulators_float_order():
    # (base + b*n) + c*context + a*tokens, bit for bit: the order records were made in before the seam
    base, a, b, c = 0.1, 3e-5, 7e-4, 1.3e-7
    m = LinearStepModel(base, a, b, c)
    for n, ctx, tok in ((3, 1234, 77), (17, 99991, 5), (1, 1, 1)):
        assert m.decode_s(n) + c * ctx + m.prefill_s([(0, tok)], n) == base + b * n + c * ctx + a * tok


def test_profile_step_time_goes_through_the_step_model():
    p = tiny_profile()
    assert p.step_model == LinearStepModel(p.base_s, p.prefill_token_s, p.decode_seq_s, p.context_token_s)
    # the profile's one-step figure and the speed figures of instance_spec, bit for bit as before the seam
    assert p.step_time_s(0, 8, 8192) == p.base_s + p.prefill_token_s * 0 + p.decode_seq_s * 8 + p.context_token_s * 8192
    assert p.step_time_s(1024, 0, 0) == p.base_s + p.prefill_token_s * 1024


@dataclass(frozen=True)
class QuadraticDecode:
    """A non-linear model: a decode step grows with the square of the batch."""

    context_token_s: float = 0.0

    def decode_s(self, num_decode: int) -> float:
        return 0.01 + 1e-3 * num_decode ** 2

    def prefill_s(self, chunks, num_decode: int) -> float:
        return sum(1e-4 * tokens + 1e-7 * before * tokens for before, tokens in chunks)


class QuadProfile(Profile):
    @property
    def step_model(self) -> StepModel:  # type: ignore[override]
        return QuadraticDecode()


def quad_profile(**kw) -> QuadProfile:
    p = tiny_profile(**kw)
    return QuadProfile(**{f.name: getattr(p, f.name) for f in fields(Profile)})


def _times(inst, arrivals):
    ev = []
    for r in arrivals:
        ev += inst.add(r, r.arrival_s)
    ev += inst.advance(float("inf"))
    first = {e.request_id: e.time_s for e in ev if isinstance(e, FirstToken)}
    done = {e.request_id: e.time_s for e in ev if isinstance(e, Finished)}
    return first, done


def test_instance_takes_every_step_time_from_the_step_model():
    inst = SimInstance(quad_profile(chunked_prefill=True))
    first, done = _times(inst, [req(0, 0.0, 20, 3), req(1, 0.0, 12, 2)])
    # step 1 prefills request 0 alone (request 1 came after the step was planned): decode_s(0) + prefill_s
    t1 = 0.01 + 1e-4 * 20
    # step 2 decodes request 0 beside request 1's prefill: decode_s(1) + prefill_s
    t2 = t1 + (0.01 + 1e-3) + 1e-4 * 12
    # step 3 decodes both: decode_s(2); each has its last token
    t3 = t2 + (0.01 + 4e-3)
    assert first == {0: pytest.approx(t1), 1: pytest.approx(t2)}
    assert done == {0: pytest.approx(t3), 1: pytest.approx(t3)}


def test_chunks_carry_their_prior_context():
    # chunked prefill with a budget of 8: a 20-token prompt runs as chunks (0, 8), (8, 8), (16, 4)
    inst = SimInstance(quad_profile(chunked_prefill=True, max_num_batched_tokens=8))
    first, _ = _times(inst, [req(0, 0.0, 20, 1)])
    chunk = lambda before, n: 0.01 + 1e-4 * n + 1e-7 * before * n  # noqa: E731
    assert first[0] == pytest.approx(chunk(0, 8) + chunk(8, 8) + chunk(16, 4))


def test_skip_ahead_matches_stepping_under_a_nonlinear_model():
    arrivals = [req(i, 0.003 * i, 5 + 3 * i, 9 + 5 * i) for i in range(6)]
    fast = _times(SimInstance(quad_profile(num_kv_blocks=30)), arrivals)
    slow = _times(SimInstance(quad_profile(num_kv_blocks=30), skip_ahead=False), arrivals)
    for a, b in zip(fast, slow):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-12) for k in a)
