"""Export and import of a request's KV blocks between two instances (for prefill / decode disaggregation):
a hand-computed two-instance case, a refusal that changes nothing, and a clone taken while a CPU load and an
imported request are in flight runs on to the original's records."""

from __future__ import annotations

import math

import pytest

from lbbench.core import Finished, FirstToken
from lbbench.sim.cluster import ClusterSim
from lbbench.sim.fork import fork_instance
from lbbench.sim.instance import SimInstance
from lbbench.sim.kv_events import MEDIUM_GPU, BlockStored
from lbbench.sim.prefix_cache import block_keys
from factories import tiny_profile
from test_offload import _offload_profile
from test_prefix_cache import hreq
from test_properties import RR


def test_a_request_prefilled_on_one_instance_decodes_on_another():
    prof = tiny_profile(block_size=4, num_kv_blocks=20, max_num_batched_tokens=64, kv_bytes_per_block=2e6,
                        enable_prefix_caching=True)
    p, d = SimInstance(prof, index=0), SimInstance(prof, index=1)
    r = hreq(7, 0.0, 20, 5, range(6))
    p.add(r, 0.0)
    t1 = prof.base_s + prof.prefill_token_s * 20  # the prefill step ends with the first token
    assert any(isinstance(e, FirstToken) for e in p.advance(t1))
    x = p.export(7)
    keys = block_keys(r, 4)
    assert (x.num_blocks, x.block_hashes, x.num_bytes) == (5, tuple(keys[:5]), 5 * 2e6)
    assert (x.num_computed_tokens, x.generated_tokens, x.token_times_s) == (20, 1, (pytest.approx(t1),))
    p.abort(7)
    assert p.used_blocks == 0

    seen = []
    d.kv.subscribe(seen.append)
    assert d.import_blocks(x, 0.05) == []
    assert seen == [BlockStored(tuple(keys[:5]), None, 20, 4, MEDIUM_GPU)]
    assert d.used_blocks == 6  # 20 tokens and room for the next one
    ev = d.advance(math.inf)
    # no prefill: the next token is one step's (one token), then three decode steps reading 22, 23, 24 tokens
    t2 = 0.05 + prof.base_s + prof.prefill_token_s * 1
    done = t2 + sum(prof.base_s + prof.decode_seq_s + prof.context_token_s * c for c in (22, 23, 24))
    fin = [e for e in ev if isinstance(e, Finished)]
    assert len(fin) == 1 and fin[0].time_s == pytest.approx(done) and fin[0].output_tokens == 5
    assert d.used_blocks == 0


def test_an_import_that_does_not_fit_changes_nothing():
    prof = tiny_profile(block_size=4, num_kv_blocks=10, max_model_len=40)
    p, d = SimInstance(prof), SimInstance(prof)
    p.add(hreq(0, 0.0, 20, 5), 0.0)
    p.advance(0.02)
    x = p.export(0)
    d.add(hreq(1, 0.0, 17, 20), 0.0)  # holds 5 blocks: 5 free, the import needs 6
    before = (d.used_blocks, dict(d.reqs), list(d.waiting), list(d.running), d.seg_k, d.seg_end)
    assert d.import_blocks(x, 0.0) is None
    assert (d.used_blocks, dict(d.reqs), list(d.waiting), list(d.running), d.seg_k, d.seg_end) == before
    with pytest.raises(ValueError, match="prefill first"):
        d.export(1)  # still prefilling


def test_a_clone_with_a_load_in_flight_runs_on_to_the_same_records():
    prof = _offload_profile(num_kv_blocks=12, max_model_len=48, kv_bytes_per_block=2e7)  # 20 ms a block
    reqs = [hreq(0, 0.0, 16, 1, range(5)), hreq(1, 0.0, 16, 1, range(100, 105)), hreq(2, 1.0, 44, 1),
            hreq(3, 2.0, 16, 6, range(5)), hreq(4, 2.0, 16, 6, range(100, 105))]
    sim = ClusterSim(prof, 1, reqs, check_invariants=True)
    sim.set_router(RR(1))
    sim.run_until(2.08)  # request 3's load (3 blocks) ended at 2.06; request 4's runs until 2.12
    inst = sim.instances[0]
    assert [r.rid for _, r in inst.loading] == [4] and inst.kv.cpu.link_free_s == pytest.approx(2.12)
    fork = sim.clone()
    assert fork.instances[0].loading[0][1] is not inst.loading[0][1]
    assert fork.instances[0].kv.cpu.blocks == inst.kv.cpu.blocks and fork.instances[0].kv.cpu is not inst.kv.cpu
    fork.run_until(math.inf)
    sim.run_until(math.inf)
    assert fork.records == sim.records and len(sim.records) == 5


def test_a_fork_of_an_instance_holding_an_imported_request_runs_on_alike():
    prof = tiny_profile(block_size=4, num_kv_blocks=20, enable_prefix_caching=True)
    p, d = SimInstance(prof), SimInstance(prof, check_invariants=True)
    p.add(hreq(0, 0.0, 20, 9, range(8)), 0.0)
    p.advance(0.03)
    d.add(hreq(1, 0.0, 30, 12, range(8)), 0.0)
    d.advance(0.03)
    assert d.import_blocks(p.export(0), 0.03) == []
    twin = fork_instance(d)
    a, b = d.advance(math.inf), twin.advance(math.inf)
    assert a == b and {e.request_id for e in a if isinstance(e, Finished)} == {0, 1}
    assert d.used_blocks == twin.used_blocks == 0
