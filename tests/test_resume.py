"""``--resume``: an interrupted sweep resumed gives the records of an uninterrupted one; a run asking other
settings is refused with one line naming the setting."""

from __future__ import annotations

import tomllib

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli.main import main
from lbbench.experiment import ConfigError, Reporter, RunConfig, run_experiment

RUN_ID = "resumetest01"


def _cfg(**kw) -> RunConfig:
    base = dict(profile="llama2-7b-v100", instances=2, workload="poisson", rates=[4.0, 8.0], rate_per_s=None,
                requests=40, routers=["round_robin", "jsq"], timeline_interval_s=5.0)
    return RunConfig(**{**base, **kw})


class _StopAfter(Reporter):
    """Ctrl-C after ``n`` units have finished."""

    def __init__(self, n: int):
        self.n = n

    def unit_finished(self, label: str) -> None:
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt


def _tables(path):
    out = {}
    for name in ("requests", "timeline"):
        df = pl.read_parquet(path / f"{name}.parquet")
        out[name] = df.select(sorted(df.columns))
    return out


def test_resume_after_interrupted_sweep_matches_uninterrupted(tmp_path):
    whole = run_experiment(_cfg(), tmp_path / "whole", run_id=RUN_ID)
    assert whole.complete

    cut = run_experiment(_cfg(), tmp_path / "cut", run_id=RUN_ID, reporter=_StopAfter(1))
    assert not cut.complete
    doc = tomllib.loads((tmp_path / "cut" / "run.toml").read_text())
    assert doc["complete"] is False
    assert [u["label"] for u in doc["units"]] == ["round_robin-seed0-rate4"]

    notes: list[str] = []

    class Notes(Reporter):
        def note(self, message: str, warning: bool = False) -> None:
            notes.append(message)

    resumed = run_experiment(_cfg(), tmp_path / "cut", resume=True, reporter=Notes())
    assert resumed.complete and resumed.run_id == RUN_ID
    assert any("1 of 4 units complete, running 3" in n for n in notes)
    a, b = _tables(tmp_path / "whole"), _tables(tmp_path / "cut")
    for name in a:
        assert a[name].equals(b[name]), name
    assert resumed.summary.equals(whole.summary)
    doc = tomllib.loads((tmp_path / "cut" / "run.toml").read_text())
    assert doc["complete"] is True and doc["resumed_units"] == 1
    assert [u["label"] for u in doc["units"]] == [
        "round_robin-seed0-rate4", "jsq-seed0-rate4", "round_robin-seed0-rate8", "jsq-seed0-rate8"]

    again = run_experiment(_cfg(), tmp_path / "cut", resume=True)  # nothing left to run: the same records
    assert again.complete and _tables(tmp_path / "cut")["requests"].equals(a["requests"])


def test_resume_refuses_other_settings(tmp_path):
    run_experiment(_cfg(), tmp_path / "run", run_id=RUN_ID, reporter=_StopAfter(1))
    with pytest.raises(ConfigError, match=r"^--resume: run.toml has requests=40, this run asks 30$"):
        run_experiment(_cfg(requests=30), tmp_path / "run", resume=True)
    with pytest.raises(ConfigError, match=r"^--resume: run.toml has rates=4,8, this run asks 4,8,16$"):
        run_experiment(_cfg(rates=[4.0, 8.0, 16.0]), tmp_path / "run", resume=True)
    with pytest.raises(ConfigError, match=r"^--resume: run.toml has routers=round_robin,jsq, this run asks jsq$"):
        run_experiment(_cfg(routers=["jsq"]), tmp_path / "run", resume=True)


def test_cli_resume(tmp_path):
    out = tmp_path / "run"
    args = ["run", "--profile", "llama2-7b-v100", "--instances", "2", "--workload", "poisson", "--rate", "4,8",
            "--requests", "40", "--router", "round_robin,jsq", "--timeline-interval", "5", "--jobs", "1"]
    run_experiment(_cfg(), out, run_id=RUN_ID, reporter=_StopAfter(2))
    runner = CliRunner()
    bad = runner.invoke(main, [*args[:-8], "--requests", "30", *args[-6:], "--resume", str(out)])
    assert bad.exit_code == 2
    lines = bad.output.strip().splitlines()
    assert lines == ["Error: --resume: run.toml has requests=40, this run asks 30"]
    ok = runner.invoke(main, [*args, "--out", str(out), "--resume", "--format", "json"])
    assert ok.exit_code == 0, ok.output
    doc = tomllib.loads((out / "run.toml").read_text())
    assert doc["complete"] is True and doc["resumed_units"] == 2 and len(doc["units"]) == 4
    missing = runner.invoke(main, [*args, "--resume"])
    assert missing.exit_code == 2 and "--resume: give the run directory" in missing.output


# -- a live sweep over emulated instances -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def slow_fleet():
    """Two emulated instances of 2 sequences each, 20 ms a step: about 18 requests/s of 10 tokens."""
    from dataclasses import replace

    from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig, zero_latency_profile

    prof = replace(zero_latency_profile(), base_s=0.02, max_num_seqs=2)
    with EmulatorFleet(FleetConfig(prof, 2)) as f:
        yield f


def _live(endpoints, **kw) -> RunConfig:
    base = dict(endpoints=list(endpoints), workload="poisson", prompt_tokens="16", output_tokens="10",
                rates=[80.0, 6.0], rate_per_s=None, requests=30, routers=["round_robin"], timeline_interval_s=None,
                saturation_threshold_per_s=5.0, saturation_window_s=0.3, load_workers=0)
    return RunConfig(**{**base, **kw})


def test_live_sweep_goes_on_after_a_saturated_step_and_resumes(slow_fleet, tmp_path):
    cut = run_experiment(_live(slow_fleet.endpoints), tmp_path / "live", reporter=_StopAfter(1))
    assert not cut.complete
    df = pl.read_parquet(tmp_path / "live" / "requests.parquet")
    assert df["rate_per_s"].unique().to_list() == [80.0] and df["saturated"].all()

    with pytest.raises(ConfigError, match=r"^--resume: run.toml has requests=30, this run asks 20$"):
        run_experiment(_live(slow_fleet.endpoints, requests=20), tmp_path / "live", resume=True)
    done = run_experiment(_live(slow_fleet.endpoints), tmp_path / "live", resume=True)
    assert done.complete and done.run_id == cut.run_id
    df = pl.read_parquet(tmp_path / "live" / "requests.parquet")
    assert df.group_by("rate_per_s", maintain_order=True).len().rows() == [(80.0, 30), (6.0, 30)]
    steps = {r: g for (r,), g in df.partition_by("rate_per_s", as_dict=True).items()}
    assert steps[80.0]["saturated"].all() and not steps[6.0]["saturated"].any()  # the sweep went on after it
    assert steps[6.0]["error"].null_count() == 30
    assert (tmp_path / "live" / "partial" / "round_robin-seed0-rate6").is_dir()  # one folder per step
    assert set(done.summary["rate_per_s"].to_list()) == {80.0, 6.0}
