"""Executors: every unit's result exactly once, whatever runs it; a worker that dies is retried once, then named;
leaving the iteration cancels what is pending; no ray module gives the one line naming the extra."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from unit_fns import DyingUnit, slow_square, square_or_die

from lbbench.distributed import (EXTRA_HINT, ProcessExecutor, RayExecutor, SerialExecutor, UnitError,
                                 auto_batch_size, batches, require_ray)
from lbbench.errors import InputError


@given(st.integers(0, 500), st.integers(1, 50))
def test_batches_cover_every_unit_once_in_order(num_units, batch_size):
    parts = batches(num_units, batch_size)
    assert [i for r in parts for i in r] == list(range(num_units))
    assert all(1 <= len(r) <= batch_size for r in parts)
    assert len(parts) == -(-num_units // batch_size)


@given(st.integers(1, 5000), st.integers(1, 256))
def test_auto_batch_size_gives_about_four_tasks_per_cpu(num_units, num_cpus):
    size = auto_batch_size(num_units, num_cpus)
    tasks = len(batches(num_units, size))
    assert size >= 1
    assert tasks <= 4 * num_cpus  # never more tasks than that (tiny tasks cost more than they run)
    if num_units >= 4 * num_cpus:
        assert size * 4 * num_cpus >= num_units


def test_auto_batch_size_hand_computed():
    assert auto_batch_size(72, 2) == 9  # the benchmark's sweep on two CPUs: 8 tasks of 9 units
    assert auto_batch_size(1050, 64) == 5
    assert auto_batch_size(3, 16) == 1


def _units(n: int) -> list[DyingUnit]:
    return [DyingUnit(f"u{i}", i - 3) for i in range(n)]


def test_serial_and_processes_give_every_result_once():
    units = _units(11)
    expected = {i: u.value ** 2 for i, u in enumerate(units)}
    assert dict(SerialExecutor().submit(units, square_or_die)) == expected
    got = list(ProcessExecutor(2, batch_size=3).submit(units, square_or_die))
    assert sorted(i for i, _ in got) == list(range(11))
    assert dict(got) == expected


def test_processes_retry_a_dead_worker_once_then_name_the_units(tmp_path):
    units = _units(6)
    units[4] = DyingUnit("u4", 5, str(tmp_path), times=1)
    assert dict(ProcessExecutor(2, batch_size=1).submit(units, square_or_die))[4] == 25
    units[4] = DyingUnit("u4", 5, str(tmp_path), times=None)
    with pytest.raises(UnitError, match="u4") as err:
        list(ProcessExecutor(2, batch_size=1).submit(units, square_or_die))
    assert "u4" in err.value.labels


def test_ray_gives_the_serial_results(ray_session):
    units = _units(13)
    expected = dict(SerialExecutor().submit(units, square_or_die))
    for batch_size in (None, 1, 4):
        got = list(RayExecutor("auto", batch_size=batch_size).submit(units, square_or_die))
        assert sorted(i for i, _ in got) == list(range(13))
        assert dict(got) == expected


def test_ray_retries_a_dead_worker_once(ray_session, tmp_path):
    units = _units(5)
    units[3] = DyingUnit("u3", 7, str(tmp_path), times=1)
    got = dict(RayExecutor("auto", batch_size=1).submit(units, square_or_die))
    assert got[3] == 49
    assert (tmp_path / "u3.died").exists()  # it did die once


def test_ray_reports_a_unit_whose_worker_always_dies(ray_session, tmp_path):
    units = _units(5)
    units[2] = DyingUnit("u2", 7, str(tmp_path), times=None)
    with pytest.raises(UnitError) as err:
        list(RayExecutor("auto", batch_size=1).submit(units, square_or_die))
    assert err.value.labels == ["u2"]
    assert str(err.value).startswith("unit u2: its Ray worker died")


def test_ray_leaving_the_iteration_cancels_pending_tasks(ray_session, tmp_path):
    units = [(str(tmp_path), i) for i in range(24)]
    results = RayExecutor("auto", batch_size=1, max_pending=24).submit(units, slow_square)
    first = next(results)  # all 24 tasks submitted, two running at a time (num_cpus=2)
    assert first[1] == first[0] ** 2
    results.close()  # what Ctrl-C in the consumer does (the runner closes the generator)
    time.sleep(3.0)  # uncancelled, about 12 more would have started by now
    started = len(list(Path(tmp_path).glob("*.started")))
    assert started <= 8, f"{started} units started: pending tasks were not cancelled"


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(InputError) as err:
        require_ray()
    assert err.value.field == "ray"
    assert str(err.value) == f"ray: {EXTRA_HINT}"
