"""Closed-loop sessions live: against emulated instances, each turn is sent no earlier than the
previous turn's answer finished plus its think time, and the records carry session and turn."""

from lbbench.harness.replay import ReplaySettings, run_replay
from lbbench.routers import get_router
from lbbench.workloads.sessions import SessionSpec, sessions


def test_live_turns_wait_for_the_previous_answer(a100_fleet):
    reqs = sessions(24, 20.0, seed=4, spec=SessionSpec(system=64, prompts=2, turns=3, user=32, output=8,
                                                          think=0.2, block=16))
    assert any(r.turn for r in reqs)
    res = run_replay(reqs, get_router("session_affinity", num_instances=2, seed=0), a100_fleet.endpoints,
                     ReplaySettings(run_id="s", seed=0, scrape_interval_s=None))
    assert res.complete and len(res.records) == len(reqs)
    by = {(r.session_id, r.turn): r for r in res.records}
    pairs = [(by[(s, t - 1)], r) for (s, t), r in by.items() if t and (s, t - 1) in by]
    assert len(pairs) >= 5
    for prev, cur in pairs:
        assert cur.error is None and prev.finish_s is not None
        assert cur.arrival_s >= prev.finish_s + cur.think_s - 1e-6
        assert cur.actual_send_s >= prev.finish_s + cur.think_s - 1e-6
        assert cur.instance == prev.instance  # session affinity, live
