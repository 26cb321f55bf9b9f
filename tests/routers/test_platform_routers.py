"""The routers platform teams deploy (Dynamo's KV cost, llm-d's sticky-until-saturated and predicted latency):
one hand-computed decision each at published defaults, their options' ranges, and a run in the simulator."""

import importlib.util
import random

import pytest
from click.testing import CliRunner

from lbbench.core import ClusterView, Finished, FirstToken, InstanceSpec, InstanceView, Preempted, Request
from lbbench.errors import InputError
from lbbench.routers import available_routers, get_router
from lbbench.routers.heuristics import LeastRequests
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
    pl = get_router("predicted_latency", num_instances=3, epsilon=0.0)
    lr = LeastRequests(3)
    for k in range(50):
        v = view(*(iv(i, outstanding=rng.randint(0, 4)) for i in range(3)))
        assert pl.route([hreq(k)], v, 0.0).instance == lr.route([hreq(k)], v, 0.0).instance
    assert not pl.fitted and pl.cold_decisions == 50
    assert "routed all 50 requests as least_requests" in pl.run_notes()[0]


def _train(r, n, slope_s_per_token, rng, start=0):
    """Dispatch ``n`` requests on random views; each one's TTFT is 0.05 s + slope x the queued prompt tokens of
    the instance it went to, its TPOT 0.01 s."""
    for k in range(start, start + n):
        v = view(*(iv(i, outstanding=rng.randint(0, 6), prompt_pending=rng.randint(0, 4000)) for i in range(2)))
        inst = r.route([hreq(k, out=11)], v, float(k)).instance
        ttft = 0.05 + slope_s_per_token * v.instances[inst].prompt_tokens_pending
        r.on_event(FirstToken(k, inst, k + ttft))
        r.on_event(Finished(k, inst, k + ttft + 0.1, 11))


def test_predicted_latency_fits_online_and_follows_its_predictions():
    rng = random.Random(0)
    r = get_router("predicted_latency", num_instances=2, epsilon=0.0, min_samples=10, refit_every=20)
    _train(r, 9, 1e-3, rng)
    assert not r.fitted
    _train(r, 1, 1e-3, rng, start=9)
    assert r.fitted and r.first_fit_completions == 10
    # instance 0 has fewer requests (least_requests' pick) but 3000 queued prompt tokens: ~3.05 s vs ~0.15 s
    v = view(iv(0, outstanding=1, prompt_pending=3000), iv(1, outstanding=5, prompt_pending=100))
    x0 = r.features(hreq(999), v.instances[0])
    assert r.predict(x0)[0] == pytest.approx(3.05, rel=0.05)
    assert r.route([hreq(999)], v, 100.0).instance == 1
    # the service slows down 3x; the next refit (as the completions double, at 20) sees it and the prediction follows
    before = r.predict(x0)[0]
    _train(r, 9, 3e-3, rng, start=1000)
    assert r.num_fits == 1 and r.predict(x0)[0] == before
    _train(r, 1, 3e-3, rng, start=1009)
    assert r.num_fits == 2 and r.predict(x0)[0] > 1.5 * before
    _train(r, 20, 3e-3, rng, start=1010)  # then every refit_every (20)
    assert r.num_fits == 3
    notes = r.run_notes()
    assert "routed its first 10 of" in notes[0] and "first fit after 10 completions" in notes[0]
    assert "TTFT MAPE" in notes[1] and "TPOT MAPE" in notes[1]


def test_predicted_latency_hand_computed_choices():
    healthy = [iv(0, outstanding=1), iv(1, outstanding=1), iv(2, outstanding=1)]
    preds = {0: (0.5, 0.02), 1: (0.9, 0.03), 2: (1.5, 0.01)}
    # no SLO: predicted E2E with 10 output tokens: 0.7, 1.2, 1.6
    r = get_router("predicted_latency", num_instances=3, epsilon=0.0)
    assert r._choose(hreq(0, out=10), healthy, preds) == 0
    # SLOs 1 s / 0.05 s: 0 and 1 meet both; headroom (0.5, 0.03) and (0.1, 0.02), normalised over the tier
    # (1, 1) and (0, 0): strategy "least" takes the one closest to its SLOs, instance 1
    r = get_router("predicted_latency", num_instances=3, epsilon=0.0, slo_ttft_s=1.0, slo_tpot_s=0.05)
    assert r._choose(hreq(0, out=10), healthy, preds) == 1
    # SLOs 0.4 s / 0.025 s: nobody meets TTFT; 0 and 2 meet TPOT (the "only TTFT missed" bucket). Headroom
    # (-0.1, 0.005) and (-1.1, 0.015) normalise to (1, 0) and (0, 1): blends 0.8 and 0.2, the least deficit is 0
    r = get_router("predicted_latency", num_instances=3, epsilon=0.0, slo_ttft_s=0.4, slo_tpot_s=0.025)
    assert r._choose(hreq(0, out=10), healthy, preds) == 0
    # an idle instance in the negative tier goes first
    idle = [iv(0, outstanding=1), iv(1, outstanding=0), iv(2, outstanding=1)]
    assert r._choose(hreq(0, out=10), idle, preds) == 1


# ---------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("name,opts", [
    ("kv_overlap", {"temperature": -1}), ("kv_overlap", {"overlap_weight": -0.5}),
    ("token_affinity", {"affinity_threshold": 1.5}), ("token_affinity", {"max_ttft_penalty_s": -1}),
    ("token_affinity", {"peak_prefill_tokens_per_s": 0}), ("token_affinity", {"exploration_probability": 2}),
    ("predicted_latency", {"epsilon": -0.1}), ("predicted_latency", {"slo_ttft_s": 0}),
    ("predicted_latency", {"min_samples": 1}), ("predicted_latency", {"model": "xgboost"}),
])
def test_options_out_of_range(name, opts):
    with pytest.raises(InputError, match=name):
        get_router(name, num_instances=2, **opts)


def test_missing_model_library_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "sklearn" else real(n, *a))
    with pytest.raises(InputError, match="install the learn extra"):
        get_router("predicted_latency", num_instances=2, model="bayesian_ridge")


def test_cli_says_one_line_and_exits_2():
    from lbbench.cli import main
    res = CliRunner().invoke(main, ["run", "--profile", "llama3.1-8b-a100", "--instances", "2", "--requests", "5",
                                    "--router", "kv_overlap", "--router-opt", "kv_overlap.temperature=-1"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "temperature must be >= 0" in lines[0]


# ---------------------------------------------------------------------------------------------- simulator

@pytest.mark.parametrize("name", NEW)
def test_end_to_end_in_the_simulator(name):
    router, reqs, recs = run_sessions(name)
    assert sorted(r.request_id for r in recs) == list(range(len(reqs)))
    assert sum(r.cached_prompt_tokens for r in recs) > 0
    if name == "predicted_latency":
        assert router.fitted and router.prediction_error()["ttft_samples"] > 0
        assert 0 < router.cold_decisions < len(reqs)
