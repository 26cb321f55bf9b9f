"""Capacity-aware routers: hand-computed decisions on a fast and a slow instance, cases where the
speed-blind form sends a request where it completes later, and valid healthy instances always."""

from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.core import ClusterState, ClusterView, Dispatched, InstanceHealth, InstanceSpec, InstanceView
from lbbench.routers import available_routers, get_router
from lbbench.routers.capacity import drain_time_s, job_time_s, ready_time_s
from factories import req

CAPACITY = ["weighted_round_robin", "jsq_speed", "least_work_speed", "min_min_speed"]

# three times the decode and prefill speed; a quarter of the single-stream step
FAST = InstanceSpec(max_num_seqs=128, kv_capacity_tokens=10**6, min_step_s=0.01, batch_decode_tokens_per_s=3000.0,
                    prefill_tokens_per_s=12000.0, profile_name="fast")
SLOW = InstanceSpec(max_num_seqs=128, kv_capacity_tokens=10**6, min_step_s=0.04, batch_decode_tokens_per_s=1000.0,
                    prefill_tokens_per_s=4000.0, profile_name="slow")


def _iv(index, spec, *, outstanding=0, prompt_pending=0, remaining=0, healthy=True):
    return InstanceView(index=index, healthy=healthy, spec=spec, num_outstanding=outstanding,
                        num_prefilling=0, num_decoding=outstanding, prompt_tokens_pending=prompt_pending,
                        context_tokens=0, predicted_tokens_remaining=remaining,
                        predicted_footprint_tokens=prompt_pending + remaining, min_remaining_tokens=None,
                        prompt_bucket_counts=(), decode_bucket_counts=(), metrics=None)


def _view(*ivs):
    return ClusterView(now_s=0.0, instances=tuple(ivs))


def _route(name, queue, view):
    return get_router(name, num_instances=len(view.instances), seed=0).route(queue, view, 0.0)


def test_registered_with_descriptions():
    names = available_routers()
    for n in CAPACITY:
        assert "speed" in names[n]


def test_weighted_round_robin_is_nginx_smooth_sequence():
    # weights 3000 and 1000: nginx's smooth sequence for 3:1 is a, a, b, a
    r = get_router("weighted_round_robin", num_instances=2)
    view = _view(_iv(0, FAST), _iv(1, SLOW))
    assert [r.route([req(0, 0, 1, 1)], view, 0).instance for _ in range(8)] == [0, 0, 1, 0] * 2
    # slow first: current weights (1000, 3000) -> 1; (2000, 2000) -> 0, the first maximum; then 1, 1
    r = get_router("weighted_round_robin", num_instances=2)
    view = _view(_iv(0, SLOW), _iv(1, FAST))
    assert [r.route([req(0, 0, 1, 1)], view, 0).instance for _ in range(4)] == [1, 0, 1, 1]
    r.reset()
    assert r.route([req(0, 0, 1, 1)], view, 0).instance == 1


def test_weighted_round_robin_finishes_equal_requests_sooner_than_round_robin():
    view = _view(_iv(0, FAST), _iv(1, SLOW))
    out_tokens = 600

    def makespan_s(name):
        r = get_router(name, num_instances=2)
        counts = [0, 0]
        for _ in range(4):
            counts[r.route([req(0, 0, 1, out_tokens)], view, 0).instance] += 1
        return max(c * out_tokens / s.batch_decode_tokens_per_s for c, s in zip(counts, (FAST, SLOW)))

    assert makespan_s("weighted_round_robin") == 0.6  # 3 requests on the fast one, 1 on the slow one
    assert makespan_s("round_robin") == 1.2  # 2 on the slow one take twice as long


def test_weighted_round_robin_skips_a_down_instance():
    r = get_router("weighted_round_robin", num_instances=2)
    view = _view(_iv(0, FAST, healthy=False), _iv(1, SLOW))
    assert [r.route([req(0, 0, 1, 1)], view, 0).instance for _ in range(3)] == [1, 1, 1]


def test_jsq_speed_counts_requests_per_speed():
    # (3 + 1) / 3000 = 1.33 ms < (1 + 1) / 1000 = 2 ms: the fast instance, though its queue is longer
    view = _view(_iv(0, FAST, outstanding=3), _iv(1, SLOW, outstanding=1))
    assert _route("jsq_speed", [req(0, 0, 10, 10)], view).instance == 0
    # (5 + 1) / 3000 = 2 ms > (0 + 1) / 1000 = 1 ms: the slow one
    view = _view(_iv(0, FAST, outstanding=5), _iv(1, SLOW, outstanding=0))
    assert _route("jsq_speed", [req(0, 0, 10, 10)], view).instance == 1


def test_least_requests_joins_the_slow_queue_that_completes_later():
    view = _view(_iv(0, FAST, outstanding=3), _iv(1, SLOW, outstanding=1))
    blind = _route("least_requests", [req(0, 0, 10, 10)], view).instance
    aware = _route("jsq_speed", [req(0, 0, 10, 10)], view).instance
    assert (blind, aware) == (1, 0)
    # requests of L tokens each: the slow queue of 2 ends at 2L/1000, the fast one of 4 at 4L/3000
    finish_s = [(iv.num_outstanding + 1) * 600 / iv.spec.batch_decode_tokens_per_s for iv in view.instances]
    assert finish_s[aware] < finish_s[blind]


def test_least_work_speed_hand_computed():
    r = req(0, 0, 100, 200)
    fast = _iv(0, FAST, outstanding=4, prompt_pending=1200, remaining=4000)
    slow = _iv(1, SLOW, outstanding=1, remaining=1500)
    # fast: 1300 / 12000 + 4200 / 3000 = 1.508 s; slow: 100 / 4000 + 1700 / 1000 = 1.725 s
    assert abs(drain_time_s(fast, 100, 200) - (1300 / 12000 + 4200 / 3000)) < 1e-12
    assert abs(drain_time_s(slow, 100, 200) - 1.725) < 1e-12
    assert _route("least_work_speed", [r], _view(fast, slow)).instance == 0
    # jsq counts tokens: 5200 on the fast one against 1500 on the slow one, where the request ends later
    assert _route("jsq", [r], _view(fast, slow)).instance == 1
    # with 6000 decode tokens left the fast one drains at 2.175 s: the slow one
    fast = _iv(0, FAST, outstanding=4, prompt_pending=1200, remaining=6000)
    assert _route("least_work_speed", [r], _view(fast, slow)).instance == 1


def test_min_min_speed_hand_computed():
    long, short = req(0, 0, 100, 200), req(1, 0, 50, 20)
    fast = _iv(0, FAST, outstanding=1, remaining=10)  # ready at 10 x 0.01 s / 1 = 0.1 s
    slow = _iv(1, SLOW)  # ready now
    assert abs(ready_time_s(fast) - 0.1) < 1e-12 and ready_time_s(slow) == 0.0
    # the short request: on fast 0.1 + 50/12000 + 20 x 0.01 = 0.304 s; on slow 50/4000 + 20 x 0.04 = 0.8125 s
    assert abs(job_time_s(short, SLOW) - 0.8125) < 1e-12
    d = _route("min_min_speed", [long, short], _view(fast, slow))
    assert (d.queue_index, d.instance) == (1, 0)
    # min_min takes the same request to the instance free first, the slow one, where it ends 0.5 s later
    blind = _route("min_min", [long, short], _view(fast, slow))
    assert (blind.queue_index, blind.instance) == (1, 1)
    # a busier fast instance (ready at 1 s): the slow one is now the earlier completion
    fast = _iv(0, FAST, outstanding=1, remaining=100)
    d = _route("min_min_speed", [long, short], _view(fast, slow))
    assert (d.queue_index, d.instance) == (1, 1)


def test_identical_instances_behave_as_the_blind_forms():
    a, b, c = (_iv(i, FAST, outstanding=n, remaining=100 * n) for i, n in enumerate((2, 1, 3)))
    view = _view(a, b, c)
    wrr, rr = get_router("weighted_round_robin", num_instances=3), get_router("round_robin", num_instances=3)
    q = [req(0, 0, 1, 1)]
    assert [wrr.route(q, view, 0).instance for _ in range(6)] == [rr.route(q, view, 0).instance for _ in range(6)]
    assert _route("jsq_speed", q, view).instance == _route("least_requests", q, view).instance == 1
    assert _route("least_work_speed", q, view).instance == _route("jsq", q, view).instance == 1


def test_every_instance_down_defers():
    view = _view(_iv(0, FAST, healthy=False), _iv(1, SLOW, healthy=False))
    for name in CAPACITY:
        assert _route(name, [req(0, 0, 1, 1)], view) is None


_spec = st.builds(InstanceSpec, max_num_seqs=st.integers(1, 256), kv_capacity_tokens=st.integers(1000, 10**6),
                  min_step_s=st.floats(1e-3, 0.1), batch_decode_tokens_per_s=st.floats(10.0, 1e4),
                  prefill_tokens_per_s=st.floats(100.0, 1e5))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(CAPACITY), specs=st.lists(_spec, min_size=1, max_size=5),
       load=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 500), st.integers(1, 900)), max_size=20),
       down=st.sets(st.integers(0, 4)), queue=st.lists(st.tuples(st.integers(1, 500), st.integers(1, 900)),
                                                        min_size=1, max_size=4), calls=st.integers(1, 4))
def test_always_a_healthy_instance(name, specs, load, down, queue, calls):
    n = len(specs)
    state = ClusterState(specs)
    for k, (i, p, o) in enumerate(load):
        state.apply(Dispatched(req(k, 0.0, p, o), i % n, 0.0))
    down = {d for d in down if d < n}
    for d in down:
        state.apply(InstanceHealth(d, 0.0, False))
    r = get_router(name, num_instances=n, seed=1)
    q = [req(100 + k, 0.0, p, o) for k, (p, o) in enumerate(queue)]
    for _ in range(calls):
        d = r.route(q, state.view(), 0.0)
        if len(down) == n:
            assert d is None
        else:
            assert d is not None and 0 <= d.queue_index < len(q) and 0 <= d.instance < n
            assert d.instance not in down
