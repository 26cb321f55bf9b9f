"""The instance model: exact timings on hand-checkable cases, preemption, chunking."""

import pytest

from lbbench.core import Finished, FirstToken, Preempted
from lbbench.sim.instance import SimInstance
from factories import req, tiny_profile


def run_all(inst: SimInstance, arrivals):
    events = []
    for r in arrivals:
        events += inst.add(r, r.arrival_s)
    events += inst.advance(float("inf"))
    return events


def test_single_request_timing_is_exact():
    p = tiny_profile()
    inst = SimInstance(p)
    ev = run_all(inst, [req(0, 0.0, prompt=10, output=5)])
    prefill = p.base_s + p.prefill_token_s * 10
    first = [e for e in ev if isinstance(e, FirstToken)]
    assert len(first) == 1 and first[0].time_s == pytest.approx(prefill)
    # 4 decode steps, each reading the growing context: 10+1, 10+2, ... (KV of computed tokens + the new one)
    decode = sum(p.base_s + p.decode_seq_s + p.context_token_s * (10 + k) for k in range(1, 5))
    fin = [e for e in ev if isinstance(e, Finished)]
    assert len(fin) == 1 and fin[0].time_s == pytest.approx(prefill + decode)
    assert fin[0].output_tokens == 5
    assert inst.used_blocks == 0 and inst.num_running == 0


def test_new_request_waits_for_the_step_in_progress():
    p = tiny_profile()
    inst = SimInstance(p)
    inst.add(req(0, 0.0, 10, 50), 0.0)
    t_mid = 0.05  # in the middle of request 0's decode
    inst.add(req(1, t_mid, 10, 3), t_mid)
    ev = inst.advance(float("inf"))
    ft = {e.request_id: e.time_s for e in ev if isinstance(e, FirstToken)}
    assert ft[1] > t_mid
    # its prefill starts at a step boundary at or after t_mid, so it cannot finish before t_mid + prefill
    assert ft[1] >= t_mid + p.prefill_token_s * 10


def test_kv_exhaustion_preempts_newest_and_everything_finishes():
    p = tiny_profile(num_kv_blocks=12, block_size=4, max_model_len=48)
    inst = SimInstance(p, check_invariants=True)
    reqs = [req(i, 0.001 * i, prompt=8, output=30) for i in range(4)]
    ev = run_all(inst, reqs)
    pre = [e for e in ev if isinstance(e, Preempted)]
    fin = [e for e in ev if isinstance(e, Finished)]
    assert pre, "4 x (8+30) tokens cannot fit in 48 KV tokens at once"
    assert sorted(e.request_id for e in fin) == [0, 1, 2, 3]
    # the newest running request is the victim: request 0 (oldest) is never preempted
    assert 0 not in {e.request_id for e in pre}
    assert inst.num_preemptions == len(pre)


def test_chunked_prefill_splits_long_prompts():
    p = tiny_profile(max_num_batched_tokens=16, chunked_prefill=True, max_model_len=256)
    inst = SimInstance(p)
    ev = run_all(inst, [req(0, 0.0, prompt=40, output=2)])
    first = next(e for e in ev if isinstance(e, FirstToken))
    # 40 prompt tokens at 16 per step: 3 steps (16 + 16 + 8)
    expected = 3 * p.base_s + p.prefill_token_s * 40
    assert first.time_s == pytest.approx(expected)


def test_without_chunking_a_prompt_prefills_in_one_step():
    p = tiny_profile(max_num_batched_tokens=16, chunked_prefill=False, max_model_len=256)
    inst = SimInstance(p)
    ev = run_all(inst, [req(0, 0.0, prompt=40, output=2)])
    first = next(e for e in ev if isinstance(e, FirstToken))
    assert first.time_s == pytest.approx(p.base_s + p.prefill_token_s * 40)


def test_oversized_request_fails_cleanly():
    p = tiny_profile(max_model_len=32)
    inst = SimInstance(p)
    ev = inst.add(req(0, 0.0, prompt=30, output=10), 0.0)
    assert ev and "max_model_len" in ev[-1].error
    assert inst.num_waiting == 0


@pytest.mark.parametrize("scheduler", ["fcfs", "bin_packing", "least_work_left"])
def test_instance_schedulers_finish_everything(scheduler):
    p = tiny_profile(num_kv_blocks=20)
    inst = SimInstance(p, scheduler=scheduler, check_invariants=True)
    reqs = [req(i, 0.0, prompt=4 + 3 * i, output=10 + (7 * i) % 13) for i in range(10)]
    ev = run_all(inst, reqs)
    assert sorted(e.request_id for e in ev if isinstance(e, Finished)) == list(range(10))


def test_least_work_left_starts_short_jobs_first():
    p = tiny_profile(max_num_seqs=1)
    inst = SimInstance(p, scheduler="least_work_left")
    inst.add(req(0, 0.0, 4, 5), 0.0)  # occupies the only slot
    inst.add(req(1, 0.0, 4, 50), 0.0)
    inst.add(req(2, 0.0, 4, 2), 0.0)
    ev = inst.advance(float("inf"))
    order = [e.request_id for e in ev if isinstance(e, FirstToken)]
    assert order == [0, 2, 1]
