"""The routers platform teams deploy (Dynamo's KV cost, llm-d's sticky-until-saturated and predicted latency):
one hand-computed decision each at published defaults, their options' ranges, and a run in the simulator."""

import importlib.util
import random

import numpy as np
import pytest
from click.testing import CliRunner

from lbbench.core import (ClusterView, Finished, FirstToken, InstanceSpec, InstanceView, Preempted, Request,
                          StepsAdvanced)
from lbbench.errors import InputError
from lbbench.routers import available_routers, get_router
from lbbench.routers.heuristics import LeastRequests
from lbbench.routers import llmd_picker as pick
from lbbench.routers.kv_overlap import softmax_pick
from factories import run_sessions

NEW = ["kv_overlap", "token_affinity", "predicted_latency"]
SPEC = InstanceSpec(kv_capacity_tokens=100_000, prefill_tokens_per_s=1000.0)


def hreq(i, prompt=64, out=8, hashes=(1, 2, 3, 4), g=16, session=None):
    return Request(i, 0.0, prompt, out, prefix_hashes=tuple(hashes) if hashes else None, prefix_block_tokens=g,
                   session_id=session)


def iv(index, *, outstanding=0, prefilling=0, decoding=0, prompt_pending=0, context=0, healthy=True, spec=SPEC):
    return InstanceView(index=index, healthy=healthy, spec=spec, num_outstanding=outstanding,
                        num_prefilling=prefilling, num_decoding=decoding, prompt_tokens_pending=prompt_pending,
                        context_tokens=context, predicted_tokens_remaining=0, predicted_footprint_tokens=0,
                        min_remaining_tokens=None, prompt_bucket_counts=(), decode_bucket_counts=(), metrics=None)


def view(*ivs):
    return ClusterView(now_s=0.0, instances=tuple(ivs))


def test_registered_with_their_sources():
    names = available_routers()
    assert "ai-dynamo/dynamo" in names["kv_overlap"] and "db19bd2a" in names["kv_overlap"]
    for n in ("token_affinity", "predicted_latency"):
        assert "llm-d/llm-d-router" in names[n] and "ebab6879" in names[n]


# ---------------------------------------------------------------------------------------------- kv_overlap

def _kv_state(router):
    router.trees.insert(0, hreq(100))  # instance 0 holds the whole 64-token prompt (no active request there)
    busy = hreq(101, hashes=None)  # instance 1: a 64-token request of its own, routed, no first token yet
    router.prefill.dispatched(busy, 1, 64)
    router.active.add(busy, 1)
    return view(iv(0, context=320), iv(1, prompt_pending=64, outstanding=1, prefilling=1))


def test_kv_overlap_hand_computed_cost():
    # Dynamo (scheduler.rs @ db19bd2a): logit = w x prefill_tokens / 16 + decode_blocks, blocks of 16.
    # Instance 0: overlap 4 blocks -> new tokens 64 - 4 x 16 = 0, prefill 0; decode: 0 active + 4 new blocks = 4.
    # Instance 1: overlap 0 -> prefill (64 + 64) / 16 = 8; decode: 4 active + 4 new = 8 -> w 1: 16, w 2: 24.
    # (The view's context does not enter: Dynamo counts the blocks it routed, not the engine's.)
    r = get_router("kv_overlap", num_instances=2)
    v = _kv_state(r)
    assert {i: c for i, (c, _) in r.costs(hreq(0), v).items()} == {0: 4.0, 1: 16.0}
    assert r.route([hreq(0)], v, 0.0).instance == 0  # Dynamo's defaults: weight 1, temperature 0
    r2 = get_router("kv_overlap", num_instances=2, overlap_weight=2.0)
    assert {i: c for i, (c, _) in r2.costs(hreq(0), _kv_state(r2)).items()} == {0: 4.0, 1: 24.0}


def test_kv_overlap_counts_shared_active_blocks_once():
    # instance 0 serves three decoding requests with the same 64-token prompt: 4 active blocks, not 12. The new
    # request shares them: instance 0 costs 0 (prefill) + 4 + 0 = 4; idle instance 1 costs 64/16 + 0 + 4 = 8.
    # (Counting each request's context, 3 x 64 / 16 = 12 blocks, would send it to instance 1.)
    r = get_router("kv_overlap", num_instances=2)
    for k in range(3):  # routed to 0 (what route() records), then their first tokens came
        r.trees.insert(0, hreq(100 + k))
        r.prefill.dispatched(hreq(100 + k), 0, 64)
        r.active.add(hreq(100 + k), 0)
        r.on_event(FirstToken(100 + k, 0, 1.0))
    assert r.active.num_active(0) == 4 and r.active.num_active(1) == 0 and r.prefill.tokens[0] == 0
    v = view(iv(0, outstanding=3, decoding=3, context=192), iv(1))
    assert {i: c for i, (c, _) in r.costs(hreq(0), v).items()} == {0: 4.0, 1: 8.0}
    assert r.route([hreq(0)], v, 2.0).instance == 0
    for k in (100, 101, 102, 0):  # blocks leave with the last request holding them
        r.on_event(Finished(k, 0, 3.0, 8))
    assert r.active.num_active(0) == 0


def test_kv_overlap_credits_an_inactive_cached_prefix_once():
    # overlap weight 0: decode blocks alone. Instance 0 has the prompt cached but nothing active: its decode term is
    # 0 + 4 new blocks = 4, the same as idle instance 1's (the hit is not subtracted there a second time); the tie
    # goes to the smaller prefix tree, instance 1
    r = get_router("kv_overlap", num_instances=2, overlap_weight=0.0)
    r.trees.insert(0, hreq(100))
    assert {i: c for i, (c, _) in r.costs(hreq(0), view(iv(0), iv(1))).items()} == {0: 4.0, 1: 4.0}
    assert r.route([hreq(0)], view(iv(0), iv(1)), 0.0).instance == 1


def test_kv_overlap_softmax_temperature():
    # costs 20 and 16, range 4, T = 1: weights exp(-5) and exp(-4): P(instance 0) = 1 / (1 + e) = 0.2689
    assert softmax_pick([20.0, 16.0], 1.0, 0.26) == 0 and softmax_pick([20.0, 16.0], 1.0, 0.27) == 1
    assert softmax_pick([3.0, 3.0, 3.0], 0.5, 0.5) == 1  # equal costs: uniform
    picks = []
    for seed in range(400):  # costs 4 and 16: range 12, P(instance 1) = 1 / (1 + e) = 0.2689
        r = get_router("kv_overlap", num_instances=2, seed=seed, temperature=1.0)
        picks.append(r.route([hreq(0)], _kv_state(r), 0.0).instance)
    assert 0.2 < picks.count(1) / len(picks) < 0.34


def test_kv_overlap_ties_go_to_the_smaller_tree():
    r = get_router("kv_overlap", num_instances=2)
    r.trees.insert(0, hreq(100, hashes=(9, 8, 7, 6)))  # a tree on 0 that the request does not match
    assert r.route([hreq(0)], view(iv(0), iv(1)), 0.0).instance == 1


def test_kv_overlap_counts_prefill_until_the_first_token():
    r = get_router("kv_overlap", num_instances=2)
    r.route([hreq(0, hashes=None)], view(iv(0), iv(1)), 0.0)
    inst = r._last
    assert r.prefill.tokens[inst] == 64
    r.on_event(Preempted(0, inst, 0.5))  # the router never sees engine preemptions: nothing changes
    assert r.prefill.tokens[inst] == 64
    r.on_event(FirstToken(0, inst, 1.0))
    assert r.prefill.tokens[inst] == 0 and r.active.num_active(inst) == 4


# ---------------------------------------------------------------------------------------------- token_affinity

def _affinity(inflight0, **opts):
    r = get_router("token_affinity", num_instances=2, **opts)
    r.trees.insert(0, hreq(100))  # instance 0 holds the prompt's one 64-token block: prefix score 1.0 >= 0.8, sticky
    r.inflight.tokens[0] = inflight0
    return r.route([hreq(0)], view(iv(0), iv(1)), 0.0).instance


def test_token_affinity_sticky_until_saturated():
    # 1000 prefill tokens/s: 10,000 in-flight tokens is 10 s behind the idle instance, within 18 s: it sticks
    assert _affinity(10_000) == 0
    # 20,000 tokens is 20 s behind, past 18 s: stickiness breaks, the fewest in-flight tokens win
    assert _affinity(20_000) == 1
    # llm-d's one throughput figure: 300,000 / 15,928 = 18.8 s > 18 s breaks; 280,000 (17.6 s) sticks
    assert _affinity(300_000, peak_prefill_tokens_per_s=15928) == 1
    assert _affinity(280_000, peak_prefill_tokens_per_s=15928) == 0
    assert _affinity(10**9, max_ttft_penalty_s=0) == 0  # 0 always sticks


def test_token_affinity_prompts_under_512_tokens_stick():
    # llm-d (approximateprefix/plugin.go, prefixhash/hashing.go @ ebab6879): 64-token blocks, the tail included.
    # A 300-token prompt named by one 512-token (Mooncake) hash is 5 blocks (4 x 64 + 44); sent again, all 5 match:
    # score 1.0, sticky, although instance 0 is 6 s behind idle instance 1 (6,000 tokens at 1,000 tokens/s)
    r = get_router("token_affinity", num_instances=2)
    short = Request(1, 0.0, 300, 8, prefix_hashes=(7,), prefix_block_tokens=512)
    r.trees.insert(0, short)
    r.inflight.tokens[0] = 6_000
    assert r.prefix_score(0, short) == 1.0 and r.route([short], view(iv(0), iv(1)), 0.0).instance == 0
    # a 200-token prompt with the same first tokens: blocks end at 64, 128, 192 (shared) and 200 (a different tail):
    # 3 of 4, 0.75 < 0.8: not sticky, the fewest in-flight tokens win
    shorter = Request(2, 0.0, 200, 8, prefix_hashes=(7,), prefix_block_tokens=512)
    assert r.prefix_score(0, shorter) == 0.75 and r.route([shorter], view(iv(0), iv(1)), 0.0).instance == 1
    # its in-flight load there: (4 blocks - 0 matched) x 64 = 256 tokens, as llm-d's in-flight producer counts it
    assert r.inflight.tokens[1] == 256


def test_token_affinity_threshold_and_sessions():
    # 256 tokens = 4 blocks of 64; instance 0 holds a prompt sharing the first 192 tokens: 3 of 4, 0.75 < 0.8
    r = get_router("token_affinity", num_instances=2)
    r.trees.insert(0, hreq(100, prompt=256, hashes=tuple(range(1, 13)) + (99, 98, 97, 96)))
    r.inflight.tokens[0] = 100
    full = hreq(0, prompt=256, hashes=tuple(range(1, 17)))
    assert r.prefix_score(0, full) == 0.75
    assert r.route([full], view(iv(0), iv(1)), 0.0).instance == 1
    # a session without prefix hashes sticks to its last instance while it is not saturated
    r = get_router("token_affinity", num_instances=2)
    first = r.route([hreq(1, hashes=None, session=7)], view(iv(0), iv(1)), 0.0).instance
    assert r.route([hreq(2, hashes=None, session=7)], view(iv(0), iv(1)), 0.0).instance == first


# ---------------------------------------------------------------------------------------------- predicted_latency

def test_predicted_latency_routes_as_least_requests_until_its_first_fit():
    rng = random.Random(3)
    pl = get_router("predicted_latency", num_instances=3)
    lr = LeastRequests(3)
    for k in range(50):
        v = view(*(iv(i, outstanding=rng.randint(0, 4)) for i in range(3)))
        assert pl.route([hreq(k)], v, 0.0).instance == lr.route([hreq(k)], v, 0.0).instance
    assert not pl.fitted and pl.cold_decisions == 50
    assert "routed all 50 requests as least_requests" in pl.run_notes()[0]


def _train(r, n, slope_s, rng, start=0):
    """Dispatch ``n`` requests on random views; each one's TTFT is 0.05 s + ``slope_s`` x the requests waiting at the
    instance it went to, its TPOT 0.01 s."""
    for k in range(start, start + n):
        v = view(*(iv(i, outstanding=rng.randint(1, 8), prefilling=rng.randint(0, 6)) for i in range(2)))
        inst = r.route([hreq(k, out=11)], v, float(k)).instance
        ttft = 0.05 + slope_s * v.instances[inst].num_prefilling
        r.on_event(FirstToken(k, inst, k + ttft))
        r.on_event(Finished(k, inst, k + ttft + 0.1, 11))


def test_predicted_latency_fits_online_off_the_decision_path():
    rng = random.Random(0)
    r = get_router("predicted_latency", num_instances=2, min_samples=40, refit_every=40, bucket_size=20,
                   phase_features=False)
    _train(r, 39, 0.1, rng)
    assert not r.fitted
    _train(r, 1, 0.1, rng, start=39)
    assert r.fitted and r.first_fit_completions == 40 and r.num_fits == 1
    # 5 requests waiting: ~0.55 s; none: ~0.05 s (relative loss: the log of the latency is fit)
    busy, idle = (r.features(hreq(999), iv(0, outstanding=5, prefilling=p))[0] for p in (5, 0))
    (t_busy, _), (t_idle, _) = r.predict([busy, idle])
    assert t_busy == pytest.approx(0.55, rel=0.2) and t_idle == pytest.approx(0.05, rel=0.2)
    # the service slows down 3x: nothing changes until the next refit (40 completions later); by then each
    # stratification bucket (waiting 0, 1-2, 3-5, 6-10) keeps its latest 20 samples, most of them slow ones
    _train(r, 39, 0.3, rng, start=100)
    assert r.num_fits == 1 and r.predict([busy])[0][0] == pytest.approx(t_busy)
    _train(r, 1, 0.3, rng, start=139)
    assert r.num_fits == 2 and r.predict([busy])[0][0] > 1.4 * t_busy
    notes = r.run_notes()
    assert "routed its first 40 of 80" in notes[0] and "first fit after 40 completions" in notes[0]
    assert "TTFT MAPE" in notes[1] and "TPOT MAPE" in notes[1]


def test_predicted_latency_features_hand_computed():
    # engine order: on vLLM's priority scheduler only the uncached prefill of requests served first counts.
    # hreq(0) (64 prompt, 8 output) has priority round(1000 x (64 x 2e-4 + 8 x 0.02)) = 173; pending there: one of
    # priority 100 (500 tokens, ahead) and one of 5,000 (800 tokens, behind)
    fcfs = get_router("predicted_latency", num_instances=1, phase_features=False)
    prio = get_router("predicted_latency", num_instances=1, instance_scheduler="priority", phase_features=False)
    for r in (fcfs, prio):
        r.inflight.add(1, 0, 100, 500)
        r.inflight.add(2, 0, 5000, 800)
    spec = InstanceSpec(kv_capacity_tokens=1000)
    state = iv(0, outstanding=2, prefilling=2, prompt_pending=900, context=50, spec=spec)
    row, uncached = prio.features(hreq(0), state)
    assert fcfs.features(hreq(0), state)[0][9] == 1300 and row[9] == 500 and row[5] == 1300
    # KV: 950 of 1000 tokens used (0.95); the request's 64 uncached tokens (one 64-token block) would lack 14;
    # prefix score 0 (nothing sent there), effective input 64, waiting 2 (is_queued 1), in flight 2, llm-d's
    # prefill tokens in flight 1,300, ahead in priority order 500
    assert row == (1.0, 0.95, 64.0, 2.0, 2.0, 1300.0, 0.0, 64.0, 0.0, 500.0, 14.0) and uncached == 64


def test_predicted_latency_step_phase_from_streams():
    r = get_router("predicted_latency", num_instances=1)
    r.on_event(StepsAdvanced(0, 1.00, 1))
    r.on_event(StepsAdvanced(0, 1.10, 5))  # 5 steps in 0.1 s: 0.02 s each
    r._now_s = 1.125  # 0.025 s after the last step ended: the step under way ends in 0.015 s
    row, _ = r.features(hreq(0), iv(0, outstanding=3))
    assert row[11:] == pytest.approx((0.025, 0.02, 0.015))
    assert r.features(hreq(0), iv(0, outstanding=0))[0][11:] == pytest.approx((0.0, 0.02, 0.0))  # idle: at once


def test_llmd_picker_hand_computed():
    # latency-scorer (scorer/latency/plugin.go @ ebab6879), no SLO, streaming: headrooms -TTFT and -TPOT, all
    # negative, none idle: the "both negative" group. |TTFT| 0.5, 0.75, 1.5 -> 0, 0.25, 1; |TPOT| 0.75, 1, 0.5 ->
    # 0.5, 1, 0; blend 0.8/0.2: 0.1, 0.4, 0.8; score (int((1 - blend) x 100) + 1) / 100 = 0.91, 0.61, 0.20 (in
    # floating point 1 - 0.8 is 0.19999999999999996: int gives 19, as Go's int() does)
    head_t, head_p = [-0.5, -0.75, -1.5], [-0.75, -1.0, -0.5]
    assert pick.latency_scores([0, 1, 2], head_t, head_p, [1, 1, 1]) == {0: 0.91, 1: 0.61, 2: 0.20}
    # an idle instance goes first (only idle ones are scored; alone, both dimensions have no spread: 0.5 each)
    assert pick.latency_scores([0, 1, 2], head_t, head_p, [1, 0, 1]) == {0: 0.0, 1: 0.51, 2: 0.0}
    # SLOs 1 s / 0.05 s: 0 and 1 have positive headroom (0.5, 0.03) and (0.25, 0.02): only they are scored, the one
    # closest to its SLOs (1) highest: |h| TTFT 0.5, 0.25 -> 1, 0; TPOT 0.03, 0.02 -> 1, 0: blends 1 and 0
    pos_t, pos_p = [0.5, 0.25, -0.5], [0.03, 0.02, 0.04]
    assert pick.latency_scores([0, 1, 2], pos_t, pos_p, [1, 1, 1]) == {0: 0.01, 1: 1.01, 2: 0.0}
    # the tier filter keeps the positive tier unless the draw is under epsilon
    assert pick.tier_filter([0, 1, 2], pos_t, pos_p, 0.01, lambda: 0.5) == [0, 1]
    assert pick.tier_filter([0, 1, 2], pos_t, pos_p, 0.01, lambda: 0.001) == [2]
    # strict affinity (0.99, 5 s): the sticky instance is 0.2 s slower than the best other: it stays alone;
    # 6 s slower breaks the gate
    assert pick.affinity_filter([0, 1, 2], [1.0, 0.5, 0.0], [0.3, 0.1, 0.2], 0.99, 5.0) == [0]
    assert pick.affinity_filter([0, 1, 2], [1.0, 0.5, 0.0], [6.2, 0.1, 0.2], 0.99, 5.0) == [0, 1, 2]
    # the loose gate (0.80) keeps 0 and 1
    assert pick.affinity_filter([0, 1, 2], [1.0, 0.85, 0.0], [0.3, 0.1, 0.2], 0.80, 5.0) == [0, 1]
    # weighted-random picker: in proportion to the scores, 0.91 : 0.61 : 0.20
    rng = random.Random(7)
    picks = [pick.weighted_pick({0: 0.91, 1: 0.61, 2: 0.20}, rng.random) for _ in range(20000)]
    for i, w in ((0, 0.91), (1, 0.61), (2, 0.20)):
        assert picks.count(i) / len(picks) == pytest.approx(w / 1.72, abs=0.015)
    assert pick.weighted_pick({0: 0.0, 1: 0.0}, lambda: 0.7) == 1  # all zero: uniform


def test_tree_ensemble_equals_the_models():
    from sklearn.ensemble import HistGradientBoostingRegressor

    from lbbench.routers.tree_ensemble import TreeEnsemble
    gen = np.random.default_rng(0)
    x = gen.random((400, 5))
    models = [HistGradientBoostingRegressor(max_iter=20, max_depth=5, random_state=0).fit(x, x[:, 0] * k + x[:, 1])
              for k in range(1, 5)]
    te = TreeEnsemble(models)
    rows = gen.random((7, 5))
    want = np.stack([m.predict(rows) for m in models], axis=1)
    assert np.abs(te.predict(rows) - want).max() < 1e-9
    group = np.array([0, 1, 1, 0, 0, 1, 0])  # models (0, 1) for group 0, (2, 3) for group 1
    got = te.predict_grouped(rows, group, 2)
    assert np.abs(got - np.where(group[:, None] == 0, want[:, :2], want[:, 2:])).max() < 1e-9


def test_predicted_latency_non_streaming_learns_e2e():
    rng = random.Random(1)
    r = get_router("predicted_latency", num_instances=2, streaming=False, min_samples=20, phase_features=False)
    _train(r, 20, 0.1, rng)
    assert r.fitted and r.model.targets == ("e2e",) and r.model.num_samples("e2e") == 20
    pred = r.predict([r.features(hreq(0), iv(0, outstanding=3, prefilling=2))[0]])
    assert pred.shape == (1, 1) and pred[0][0] == pytest.approx(0.05 + 0.2 + 0.1, rel=0.2)  # TTFT + 0.1 s decode


# ---------------------------------------------------------------------------------------------- simulator

@pytest.mark.parametrize("name", NEW)
def test_end_to_end_in_the_simulator(name):
    router, reqs, recs = run_sessions(name)
    assert sorted(r.request_id for r in recs) == list(range(len(reqs)))
    assert sum(r.cached_prompt_tokens for r in recs) > 0
    if name == "predicted_latency":  # the first fit needs 100 samples of each target: a short warm end
        assert 100 <= router.cold_decisions < len(reqs) and router.fitted


def test_predicted_latency_in_the_simulator_fits_and_predicts():
    from lbbench.sim.cluster import ClusterSim
    from lbbench.workloads.agentic import AgenticSpec, agentic
    from factories import tiny_profile
    prof = tiny_profile(num_kv_blocks=2000, block_size=16, max_model_len=4096, max_num_batched_tokens=2048,
                        max_num_seqs=32)
    reqs = agentic(400, 6.0, 0, AgenticSpec(system=256, task=200, result=100, call=20, answer=30), max_model_len=4096)
    router = get_router("predicted_latency", num_instances=3, seed=0, profile=prof, min_samples=50, refit_every=50)
    recs = ClusterSim(prof, 3, reqs, check_invariants=True, prefix_caching=True).run(router)
    assert sorted(r.request_id for r in recs) == list(range(400))
    assert router.fitted and router.num_fits >= 3 and 0 < router.cold_decisions < 400
    err = router.prediction_error()
    assert err["ttft_samples"] > 200 and err["ttft_mape_pct"] < 60
