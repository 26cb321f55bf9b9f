"""Sweeps as units: records from Ray tasks and from a process pool equal a serial run's; Ctrl-C keeps the units
that finished, marked incomplete; a unit whose worker died twice stops the run and is named."""

from __future__ import annotations

import tomllib

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from lbbench.distributed import Executor, ProcessExecutor, RayExecutor, SerialExecutor, UnitError
from lbbench.experiment import Reporter, RunConfig, run_experiment
from lbbench.experiment import works
from lbbench.experiment.backends import SimBackend
from lbbench.profiles import load_profile

#: 2 rates x 2 routers x 2 instance schedulers x 2 seeds = 16 units
SWEEP = RunConfig(profile="llama2-7b-v100", instances=4, workload="paper-mix", rates=[15.0, 30.0], requests=120,
                  routers=["round_robin", "jsq"], instance_schedulers=["fcfs", "least_work_left"], seeds=2)


def _frames(path):
    return {name: pl.read_parquet(path / f"{name}.parquet") for name in ("requests", "timeline", "summary")}


def _run(executor: Executor, out, reporter=None):
    return run_experiment(SWEEP, out, executor=executor, run_id="fixed", reporter=reporter)


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    outcome = _run(SerialExecutor(), out)
    assert outcome.complete
    return out


def test_sweep_covers_every_unit(serial_run):
    df = pl.read_parquet(serial_run / "requests.parquet")
    assert df.height == 16 * 120
    units = df.select("rate_per_s", "router", "instance_scheduler", "seed").unique()
    assert units.height == 16


def test_ray_records_equal_a_serial_run(ray_session, serial_run, tmp_path):
    outcome = _run(RayExecutor("auto", batch_size=3), tmp_path)
    assert outcome.complete
    for name, frame in _frames(tmp_path).items():
        assert_frame_equal(frame, _frames(serial_run)[name], check_exact=True)
    doc = tomllib.loads((tmp_path / "run.toml").read_text())
    assert doc["executor"] == "ray" and doc["ray_cpus"] == 2 and doc["complete"] is True


def test_process_pool_records_equal_a_serial_run(serial_run, tmp_path):
    assert _run(ProcessExecutor(2), tmp_path).complete
    for name, frame in _frames(tmp_path).items():
        assert_frame_equal(frame, _frames(serial_run)[name], check_exact=True)


class _InterruptAfter(Reporter):
    """Ctrl-C arriving while the third unit's result is handed over."""

    def __init__(self, n: int):
        self.n, self.finished = n, 0

    def unit_finished(self, label: str) -> None:
        self.finished += 1
        if self.finished == self.n:
            raise KeyboardInterrupt


def test_ctrl_c_keeps_finished_units_marked_incomplete(ray_session, serial_run, tmp_path):
    outcome = _run(RayExecutor("auto", batch_size=1), tmp_path, reporter=_InterruptAfter(3))
    assert not outcome.complete
    doc = tomllib.loads((tmp_path / "run.toml").read_text())
    assert doc["complete"] is False and doc["runs_completed"] == 3
    kept = pl.read_parquet(tmp_path / "requests.parquet")
    assert kept.height == 3 * 120
    keys = ["rate_per_s", "instance_scheduler", "seed", "router"]
    serial = pl.read_parquet(serial_run / "requests.parquet")
    for key in kept.select(keys).unique().iter_rows():  # each kept unit is exactly the serial run's
        mine = kept.filter(pl.all_horizontal([pl.col(k) == v for k, v in zip(keys, key)]))
        theirs = serial.filter(pl.all_horizontal([pl.col(k) == v for k, v in zip(keys, key)]))
        assert_frame_equal(mine, theirs, check_exact=True)


class _DiesAtUnit(Executor):
    """An executor whose worker for unit ``bad`` died twice: the units before it come back (last first)."""

    def __init__(self, bad: int):
        self.bad = bad

    def submit(self, units, fn):
        for i in reversed(range(self.bad)):
            yield i, fn(units[i])
        raise UnitError([units[self.bad].label], "its Ray worker died and the retry failed too")


def test_a_unit_that_keeps_dying_is_named_and_the_rest_kept(tmp_path):
    with pytest.raises(UnitError, match=r"^unit jsq-seed1-fcfs-rate15: its Ray worker died") as err:
        _run(_DiesAtUnit(3), tmp_path)
    assert err.value.labels == ["jsq-seed1-fcfs-rate15"]
    doc = tomllib.loads((tmp_path / "run.toml").read_text())
    assert doc["complete"] is False and doc["runs_completed"] == 3 and "jsq-seed1-fcfs-rate15" in doc["error"]
    kept = pl.read_parquet(tmp_path / "requests.parquet")
    assert kept["router"].to_list()[:120] == ["round_robin"] * 120  # written in unit order, not finish order
    assert kept.height == 3 * 120


def test_one_unit_alone_is_the_serial_units_records(serial_run):
    units = works(SWEEP.resolved(), load_profile("llama2-7b-v100"), "fixed")
    assert [w.label for w in units[:3]] == ["round_robin-seed0-fcfs-rate15", "jsq-seed0-fcfs-rate15",
                                            "round_robin-seed1-fcfs-rate15"]
    out = SimBackend().run(units[-1])  # the last unit alone
    serial = pl.read_parquet(serial_run / "requests.parquet")
    assert_frame_equal(out.records, serial.tail(120), check_exact=True)
