"""vLLM V0 engine semantics (profile ``engine.scheduler = "v0"``, no chunked prefill): a step prefills waiting
requests only and the running decodes pause; otherwise a step decodes only. Timings checked by hand."""

import pytest

from lbbench.core import Finished, FirstToken
from lbbench.sim.cluster import ClusterSim
from lbbench.sim.instance import SimInstance
from factories import req, tiny_profile


def _first_tokens(events):
    return {e.request_id: e.time_s for e in events if isinstance(e, FirstToken)}


@pytest.mark.parametrize("engine", ["v0", "v1"])
def test_prefill_pauses_decodes_only_under_v0(engine):
    p = tiny_profile(scheduler=engine)
    inst = SimInstance(p)
    ev = inst.add(req(0, 0.0, prompt=10, output=6), 0.0)
    t1 = p.base_s + p.prefill_token_s * 10  # request 0's first token
    t2 = t1 + p.base_s + p.decode_seq_s + p.context_token_s * 11  # its second token
    ev += inst.add(req(1, t1 + 0.001, prompt=20, output=3), t1 + 0.001)  # arrives during step 2
    ev += inst.advance(float("inf"))
    first = _first_tokens(ev)
    assert first[0] == pytest.approx(t1)
    if engine == "v0":
        # step 3 prefills request 1 alone: base + 20 prefill tokens, no decode terms; request 0 waits
        assert first[1] == pytest.approx(t2 + p.base_s + p.prefill_token_s * 20)
    else:
        # step 3 mixes request 0's decode with request 1's prefill
        assert first[1] == pytest.approx(t2 + p.base_s + p.prefill_token_s * 20 + p.decode_seq_s
                                         + p.context_token_s * 12)
    fin = [e for e in ev if isinstance(e, Finished)]
    assert sorted(e.request_id for e in fin) == [0, 1]
    assert inst.used_blocks == 0


def test_v0_token_times_skip_the_prefill_only_step():
    p = tiny_profile(scheduler="v0")
    sim = ClusterSim(p, 1, [req(0, 0.0, 10, 6), req(1, 0.0115, 20, 3)], check_invariants=True)

    class One:
        name = "one"

        def route(self, queue, view, now_s):
            from lbbench.core import Decision
            return Decision(0, 0)

    recs = {r.request_id: r for r in sim.run(One())}
    a, b = recs[0], recs[1]
    t1 = p.base_s + p.prefill_token_s * 10
    t2 = t1 + p.base_s + p.decode_seq_s + p.context_token_s * 11
    prefill_b = p.base_s + p.prefill_token_s * 20
    assert b.first_token_s == pytest.approx(t2 + prefill_b)
    # request 0's longest gap holds request 1's prefill step and the next two-sequence decode step
    assert a.tbt_max_s == pytest.approx(prefill_b + p.base_s + 2 * p.decode_seq_s + p.context_token_s * (12 + 21))
    assert a.generated_tokens == 6 and b.generated_tokens == 3


def test_v0_admission_keeps_the_watermark():
    # 100 blocks of 4: the 1 % watermark is one block; 24 tokens fill 6 blocks each
    p = tiny_profile(scheduler="v0", num_kv_blocks=100, max_num_seqs=64, max_num_batched_tokens=256)
    inst = SimInstance(p, check_invariants=True)
    for i in range(20):
        inst.add(req(i, 0.0, 24, 40), 0.0)
    assert inst.kv.watermark_blocks == 1
    assert inst.num_blocks - inst.used_blocks >= 1  # admission stopped above the watermark
    inst.advance(float("inf"))
    assert inst.used_blocks == 0 and not inst.reqs


def test_v0_with_chunked_prefill_is_the_mixed_scheduler():
    p = tiny_profile(scheduler="v0", chunked_prefill=True)
    assert not SimInstance(p).v0
