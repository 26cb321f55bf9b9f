"""The live decision loop shared by replay and proxy: epochs, deferral ticks, token events, health."""

from __future__ import annotations

import asyncio

import pytest

from lbbench.core import Decision, FirstToken, InstanceSpec, Request, TokensGenerated
from lbbench.live.drive import Drive


class _DeferN:
    """Defers every request ``n`` times, then sends it to instance 1."""

    name = "defer_n"

    def __init__(self, n: int):
        self.n = n
        self.calls = 0

    def route(self, queue, view, now_s):
        self.calls += 1
        if self.calls <= self.n or not view.instances[1].healthy:
            return None
        return Decision(0, 1)


def _req(i: int, t: float = 0.0) -> Request:
    return Request(request_id=i, arrival_s=t, prompt_tokens=10, output_tokens=5)


async def test_an_epoch_dispatches_and_a_deferral_ticks_every_min_step():
    got = []
    drive = Drive(_DeferN(2), [InstanceSpec(), InstanceSpec()], min_step_s=0.01,
                  on_dispatch=lambda req, inst, now: got.append((req.request_id, inst, now)))
    drive.start_clock()
    drive.arrive(_req(7))
    drive.epoch()
    assert got == [] and len(drive) == 1
    await asyncio.sleep(0.1)  # two ticks defer again, the third dispatches
    assert [(r, i) for r, i, _ in got] == [(7, 1)] and len(drive) == 0
    assert got[0][2] >= 0.02
    drive.close()


async def test_withdraw_and_drop_all_empty_the_queue():
    drive = Drive(_DeferN(10**6), [InstanceSpec()] * 2, min_step_s=10.0, on_dispatch=lambda *a: None)
    for i in range(3):
        drive.arrive(_req(i))
    drive.epoch()
    assert drive.withdraw(1).request_id == 1 and drive.withdraw(1) is None
    assert [r.request_id for r in drive.drop_all()] == [0, 2] and len(drive) == 0
    drive.close()


def test_a_router_error_goes_to_on_error_when_set_and_is_raised_otherwise():
    class Bad:
        name = "bad"

        def route(self, queue, view, now_s):
            return Decision(0, 5)  # no such instance

    errors = []
    loop = asyncio.new_event_loop()
    try:
        async def go():
            d = Drive(Bad(), [InstanceSpec()], min_step_s=1.0, on_dispatch=lambda *a: None, on_error=errors.append)
            d.arrive(_req(0))
            d.epoch()
            d2 = Drive(Bad(), [InstanceSpec()], min_step_s=1.0, on_dispatch=lambda *a: None)
            d2.arrive(_req(0))
            with pytest.raises(Exception):
                d2.epoch()
        loop.run_until_complete(go())
    finally:
        loop.close()
    assert len(errors) == 1


def test_token_observer_sends_first_token_then_at_most_one_update_per_step():
    drive = Drive(_DeferN(0), [InstanceSpec()] * 2, min_step_s=0.05, on_dispatch=lambda *a: None)
    seen = []
    drive.dispatcher.observe = seen.append  # what reaches the state
    obs = drive.token_observer(3, 1)
    for count, t in [(1, 1.00), (2, 1.01), (3, 1.04), (4, 1.05), (5, 1.07), (6, 1.11)]:
        obs(count, t)
    assert seen == [FirstToken(3, 1, 1.00), TokensGenerated(3, 1, 1.05, 4), TokensGenerated(3, 1, 1.11, 6)]


async def test_check_health_feeds_changes_and_runs_an_epoch_when_one_comes_back():
    got = []
    drive = Drive(_DeferN(0), [InstanceSpec()] * 2, min_step_s=0.01,
                  on_dispatch=lambda req, inst, now: got.append(inst))
    assert drive.mark_down(1) and not drive.mark_down(1)
    assert drive.healthy_indices() == [0]
    up = {0: True, 1: False}

    async def probe(i):
        return up[i]

    assert await drive.check_health(probe, [0, 1]) == [True, False]
    assert drive.healthy_indices() == [0]
    up[1] = True
    drive.arrive(_req(0))  # waits: the router wants instance 1
    await drive.check_health(probe, [1])
    assert drive.healthy_indices() == [0, 1] and got == [1] and len(drive) == 0
    drive.close()


async def test_an_unanswered_probe_takes_an_instance_down_only_at_the_third_in_a_row():
    from lbbench.live.drive import SLOW_PROBES_DOWN

    drive = Drive(_DeferN(0), [InstanceSpec()] * 2, min_step_s=0.01, on_dispatch=lambda req, inst, now: None)
    answers = {0: None, 1: False}

    async def probe(i):
        return answers[i]

    assert SLOW_PROBES_DOWN == 3
    assert await drive.check_health(probe, [0, 1]) == [True, False]  # refused: down at once; slow: still up
    assert await drive.check_health(probe, [0]) == [True]
    answers[0] = True
    assert await drive.check_health(probe, [0]) == [True]  # an answer resets the count
    answers[0] = None
    for _ in range(SLOW_PROBES_DOWN - 1):
        assert await drive.check_health(probe, [0]) == [True]
    assert await drive.check_health(probe, [0]) == [False] and drive.healthy_indices() == []
    assert await drive.check_health(probe, [0]) == [False]  # a down instance stays down until it answers
    answers[0] = True
    assert await drive.check_health(probe, [0]) == [True] and drive.healthy_indices() == [0]
    drive.close()


def test_quiet_gc_freezes_during_the_run_and_restores_the_collector():
    import gc

    from lbbench.live.drive import QUIET_GC_THRESHOLD, quiet_gc

    before = gc.get_threshold()
    with quiet_gc():
        assert gc.get_threshold() == QUIET_GC_THRESHOLD
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
