"""Actor pools: workers keep their state between calls, whatever runs them; a worker that dies is restarted and its
call retried once, then the call is named; leaving an iteration early dispatches nothing more."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from unit_fns import Counter, DyingUnit

from lbbench.distributed import (InProcessActors, ProcessActors, RayActors, UnitError, get_actor_pool)


def _units(n: int) -> list[DyingUnit]:
    return [DyingUnit(f"u{i}", i - 3) for i in range(n)]


@pytest.mark.parametrize("make", [InProcessActors, ProcessActors])
def test_workers_keep_their_state_between_calls(make):
    with make(Counter, (10,), 2) as pool:
        assert [pool.call(0, "add", 1), pool.call(0, "add", 2), pool.call(1, "add", 5)] == [11, 13, 15]
        got = list(pool.submit(_units(7), "scaled", 3))
        assert sorted(i for i, _ in got) == list(range(7))
        assert dict(got) == {i: 3 * (i - 3) ** 2 for i in range(7)}
        assert pool.call(0, "served") + pool.call(1, "served") == 3 + 7  # the same two workers served them all
        with pytest.raises(ValueError, match="asked to fail"):  # a method's own error, not retried
            pool.call(1, "fail")
        assert pool.call(1, "add", 0) == 15


def test_get_actor_pool_chooses_the_backend():
    with get_actor_pool(Counter, (), 1) as pool:
        assert isinstance(pool, InProcessActors) and pool.call(0, "pid") == os.getpid()
    with get_actor_pool(Counter, (), 2) as pool:
        assert isinstance(pool, ProcessActors)
        assert len({pool.call(0, "pid"), pool.call(1, "pid"), os.getpid()}) == 3


def test_processes_restart_a_dead_worker_and_retry_its_call_once(tmp_path):
    units = _units(5)
    units[3] = DyingUnit("u3", 7, str(tmp_path), times=1)
    with ProcessActors(Counter, (), 2) as pool:
        pids = {pool.call(0, "pid"), pool.call(1, "pid")}
        assert dict(pool.submit(units, "scaled", 2))[3] == 98
        assert (tmp_path / "u3.died").exists()  # it did die once
        after = {pool.call(0, "pid"), pool.call(1, "pid")}
        assert len(after - pids) == 1  # one worker was restarted, the other kept its process
        units[3] = DyingUnit("u3", 7, str(tmp_path), times=None)
        with pytest.raises(UnitError) as err:
            list(pool.submit(units, "scaled", 2))
        assert err.value.labels == ["scaled u3"]
        assert "died twice" in str(err.value)
        assert dict(pool.submit(_units(3), "scaled", 1)) == {0: 9, 1: 4, 2: 1}  # the pool still serves


def test_leaving_the_iteration_early_dispatches_nothing_more(tmp_path):
    with ProcessActors(Counter, (), 2) as pool:
        results = pool.submit([(str(tmp_path), i) for i in range(10)], "slow")
        i, value = next(results)
        assert value == i * i
        results.close()
        # each worker waits for the call it may still be serving, then answers: 2 calls ran, not 10
        assert pool.call(0, "served") + pool.call(1, "served") == 2
        assert len(list(Path(tmp_path).glob("*.started"))) == 2
        assert dict(pool.submit([(str(tmp_path), 5)], "slow")) == {0: 25}  # no stale result comes back


def test_at_most_max_pending_calls_in_flight(tmp_path):
    with ProcessActors(Counter, (), 2, max_pending=1) as pool:
        results = pool.submit([(str(tmp_path), i) for i in range(6)], "slow")
        next(results)
        results.close()
        assert pool.call(0, "served") + pool.call(1, "served") == 1


def test_a_started_call_runs_until_its_worker_is_told_to_stop(tmp_path):
    flag = tmp_path / "stop"
    with ProcessActors(Counter, (), 1, name="lbbench-test") as pool:
        call = pool.start(0, "wait_for", str(flag))
        assert not call.done()
        flag.touch()
        assert call.result() == str(flag) and call.done()


def test_ray_actors_keep_state_and_retry_a_dead_worker_once(ray_session, tmp_path):
    units = _units(4)
    units[2] = DyingUnit("u2", 5, str(tmp_path), times=1)
    with RayActors(Counter, (1,), 2, address="auto") as pool:
        assert [pool.call(0, "add", 1), pool.call(0, "add", 2)] == [2, 4]
        assert dict(pool.submit(units, "scaled", 3)) == {0: 27, 1: 12, 2: 75, 3: 0}
        assert (tmp_path / "u2.died").exists()
        units[2] = DyingUnit("u2", 5, str(tmp_path), times=None)
        with pytest.raises(UnitError) as err:
            list(pool.submit(units, "scaled", 3))
        assert err.value.labels == ["scaled u2"]
    assert ray_session.is_initialized()  # the pool did not start Ray: closing it leaves Ray to the test
