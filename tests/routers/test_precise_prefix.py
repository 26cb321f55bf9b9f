"""``precise_prefix``: a hand-computed decision from KV events (llm-d's longest-prefix match, min-max normalised,
3 / 2 / 2 with queue and KV headroom) with an event lag; Dynamo's rule for a chain whose parent is unknown; event
loss; in the simulator the index built from the events is the instances' cache; live backends refuse it without
every endpoint's KV-event address."""

from __future__ import annotations

import pytest

from lbbench.core import ClusterState, InstanceSpec, Request
from lbbench.experiment import ConfigError, RunConfig
from lbbench.prefix_blocks import block_keys
from lbbench.profiles import load_profile
from lbbench.routers import get_router
from lbbench.routers.kv_index import KVEventIndex
from lbbench.sim.cluster import ClusterSim
from lbbench.sim.kv_events import MEDIUM_CPU, MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored
from lbbench.workloads.sessions import SessionSpec, sessions
from factories import tiny_profile


def stored(keys, parent=None, medium=MEDIUM_GPU):
    return BlockStored(tuple(keys), parent, 4 * len(keys), 4, medium)


def test_a_decision_by_hand_with_an_event_lag():
    r = Request(0, 1.2, 16, 8, prefix_hashes=(11, 12, 13, 14), prefix_block_tokens=4)
    k = block_keys(r, 4)
    assert len(k) == 4
    router = get_router("precise_prefix", num_instances=3, seed=0, block_size=4, event_lag_s=0.5)
    events = []
    router.bind_kv_events(events.append)  # the backend hands it a subscribe function
    feed = events[0]
    feed(0, 0.0, stored(k[:2]))
    feed(1, 0.1, stored(k))
    feed(1, 0.2, BlockRemoved((k[3],), MEDIUM_GPU))
    feed(2, 1.0, stored(k))  # reaches the router at 1.5
    feed(0, 0.3, stored(k[2:], parent=k[1], medium=MEDIUM_CPU))  # a CPU tier's copy: not indexed
    view = ClusterState([InstanceSpec(kv_capacity_tokens=1000)] * 3).view()
    # at 1.2: longest prefixes 2, 3, 0 -> normalised over 2..3: 0, 1, 0; queue and KV scorers 1 everywhere:
    # totals 3*0+2+2 = 4, 3*1+4 = 7, 4 -> instance 1
    assert router.prefix_scores(r, view.instances, 1.2) == [0.0, 1.0, 0.0]
    assert router.route([r], view, 1.2) == (0, 1)
    # at 1.6 instance 2's chain has arrived: 2, 3, 4 -> 0, 0.5, 1 -> totals 4, 5.5, 7 -> instance 2
    assert router.prefix_scores(r, view.instances, 1.6) == [0.0, 0.5, 1.0]
    assert router.route([r], view, 1.6) == (0, 2)
    feed(2, 1.7, AllBlocksCleared())
    assert router.route([r], view, 2.3) == (0, 1)


def test_speculative_indexing_holds_a_decision_until_its_ttl():
    r = Request(0, 0.0, 16, 8, prefix_hashes=(11, 12, 13, 14), prefix_block_tokens=4)
    view = ClusterState([InstanceSpec(kv_capacity_tokens=1000)] * 2).view()
    plain = get_router("precise_prefix", num_instances=2, seed=0, block_size=4)
    spec = get_router("precise_prefix", num_instances=2, seed=0, block_size=4, speculative=True,
                      speculative_ttl_s=5.0)
    for router in (plain, spec):
        assert router.route([r], view, 0.0) == (0, 0)  # no events: the load scorers tie, the first instance
    # with no events yet, only the speculative router knows instance 0 will hold the prompt
    assert plain.prefix_scores(r, view.instances, 1.0) == [0.0, 0.0]
    assert spec.prefix_scores(r, view.instances, 1.0) == [1.0, 0.0]
    assert spec.prefix_scores(r, view.instances, 5.5) == [0.0, 0.0]  # expired


def test_dynamo_skips_a_chain_whose_parent_it_does_not_hold_and_loss_drops_events():
    idx = KVEventIndex(1)
    idx.apply(0, stored([7, 8], parent=6))
    assert idx.blocks[0] == set() and idx.num_skipped == 1
    idx.apply(0, stored([6]))
    idx.apply(0, stored([7, 8], parent=6))
    assert idx.longest_prefix(0, [6, 7, 8, 9]) == 3
    lossy = KVEventIndex(1, loss=0.5, seed=3)
    for t in range(2000):
        lossy.on_event(0, float(t), stored([t]))
    assert 900 < lossy.num_lost < 1100 and lossy.num_events == 2000
    with pytest.raises(ValueError, match="event_loss"):
        KVEventIndex(1, loss=1.0)
    with pytest.raises(ValueError, match="event_lag_s"):
        KVEventIndex(1, lag_s=-1.0)


def test_in_the_simulator_the_index_is_the_instances_cache():
    prof = tiny_profile(num_kv_blocks=300, block_size=4, max_model_len=1200, max_num_batched_tokens=1200,
                        max_num_seqs=16)
    reqs = sessions(150, 20.0, 0, SessionSpec(system=64, prompts=3, turns=3, user=16, output=16, think=0.5,
                                               block=4), max_model_len=1200)
    router = get_router("precise_prefix", num_instances=3, seed=0, profile=prof)
    sim = ClusterSim(prof, 3, reqs, prefix_caching=True, seed=0)
    recs = sim.run(router)
    assert len(recs) == 150 and router.bound
    router.index.catch_up(float("inf"))
    assert router.index.num_events > 0
    for i, inst in enumerate(sim.instances):
        assert router.index.blocks[i] == inst.kv.cached_hashes()
    hit = sum(r.cached_prompt_tokens or 0 for r in recs) / sum(r.prompt_tokens for r in recs)
    assert hit > 0.3


def test_live_backends_refuse_it_without_every_endpoints_kv_events():
    prof = load_profile("llama2-7b-v100")
    cfg = RunConfig(endpoints=["http://a:1"], routers=["precise_prefix"]).resolved()
    with pytest.raises(ConfigError, match="--kv-events"):
        cfg.check(prof)
    RunConfig(endpoints=["http://a:1"], kv_events=["tcp://a:5557"], routers=["precise_prefix"]).resolved().check(prof)
    with pytest.raises(ConfigError, match="1 address.*2 --endpoint"):
        RunConfig(endpoints=["http://a:1", "http://b:1"], kv_events=["tcp://a:5557"],
                  routers=["precise_prefix"]).resolved().check(prof)
    with pytest.raises(ConfigError, match="http://a:5557: expected a ZMQ address"):
        RunConfig(endpoints=["http://a:1"], kv_events=["http://a:5557"], routers=["precise_prefix"]).resolved().check(prof)
