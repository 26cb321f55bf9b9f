"""Transfer fidelity: the workload spec syntax and its refusals, the residual arithmetic by hand, and
``lbbench fidelity --calibrate-on ... --check-on ...`` end to end against emulated instances (the simulator's
instance model behind real HTTP streams), whose report must say which workload every figure came from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from lbbench.cli import main
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
from lbbench.errors import InputError
from lbbench.profiles import load_profile
from lbbench.profiling.residuals import binned, running_at_dispatch
from lbbench.profiling.workload_spec import parse_workload_spec

PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "llama3.1-8b-a100-v0.toml"


def test_spec_by_hand(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("x")
    s = parse_workload_spec(f"trace:{trace}?max_prompt_tokens=1000&requests=150&rate=1.5", "calibrate_on")
    assert (s.kind, s.value) == ("trace", str(trace))
    assert s.options == {"max_prompt_tokens": 1000, "requests": 150, "rate": 1.5}
    f = s.run_config_fields({"requests": 10, "rate_per_s": 5.0, "seed": 0, "prompt_tokens": "128"})
    assert f["trace"] == str(trace) and f["trace_options"] == {"max_prompt_tokens": 1000}
    assert (f["requests"], f["rate_per_s"], f["seed"]) == (150, 1.5, 0)  # the spec over the flags, the rest kept
    w = parse_workload_spec("workload:poisson?prompt_tokens=256:0.5&seed=3", "check_on")
    assert (w.kind, w.value, w.options) == ("workload", "poisson", {"prompt_tokens": "256:0.5", "seed": 3})
    f = w.run_config_fields({"requests": 10, "rate_per_s": 5.0, "seed": 0, "prompt_tokens": "128"})
    assert (f["workload"], f["trace"], f["prompt_tokens"], f["seed"], f["requests"]) == \
        ("poisson", None, "256:0.5", 3, 10)
    assert parse_workload_spec("workload:dataset:x.jsonl").value == "dataset:x.jsonl"


@pytest.mark.parametrize("text, problem", [
    ("poisson", "give trace:FILE"),
    ("csv:foo", "give trace:FILE"),
    ("workload:", "no workload name"),
    ("workload:poisson?requests=ten", "requests='ten' is not an integer"),
    ("workload:poisson?requests=0", "requests must be >= 1"),
    ("workload:poisson?rate=-1", "rate must be > 0"),
    ("workload:poisson?max_prompt_tokens=5", "unknown option 'max_prompt_tokens' for a workload"),
    ("workload:poisson?seed=1&seed=2", "seed given twice"),
    ("workload:poisson?seed", "expected K=V"),
    ("trace:/no/such/file.csv", "trace file /no/such/file.csv not found"),
])
def test_spec_refusals_name_the_field(text, problem):
    with pytest.raises(InputError, match="check_on") as err:
        parse_workload_spec(text, "check_on")
    assert problem in str(err.value) and str(err.value).startswith("check_on: ")


@given(requests=st.integers(1, 10_000), rate=st.floats(0.01, 1e3, allow_nan=False), seed=st.integers(-5, 10**6))
def test_spec_options_round_trip(requests, rate, seed):
    s = parse_workload_spec(f"workload:poisson?requests={requests}&rate={rate!r}&seed={seed}")
    assert s.options == {"requests": requests, "rate": rate, "seed": seed}


def test_running_at_dispatch_by_hand():
    # instance 0: a [0, 5), b [1, 3), c [4, 6); instance 1: d [2, 9)
    inst = np.array([0, 0, 0, 1])
    dispatch = np.array([0.0, 1.0, 4.0, 2.0])
    finish = np.array([5.0, 3.0, 6.0, 9.0])
    # a alone; b with a; c with a (b finished at 3); d alone on its instance
    assert running_at_dispatch(inst, dispatch, finish).tolist() == [1, 2, 2, 1]


def test_binned_errors_by_hand():
    pairs = pl.DataFrame({"workload": ["w"] * 3, "router": ["r"] * 3, "prompt_tokens": [100, 120, 600],
                          "live_e2e_s": [1.0, 3.0, 2.0], "sim_e2e_s": [1.5, 3.5, 1.0],
                          "live_ttft_s": [0.1, 0.1, 0.2], "sim_ttft_s": [0.1, 0.2, 0.1]})
    out = binned(pairs, "prompt_tokens", (0, 128, 512))
    assert out["prompt_tokens"].to_list() == ["0-127", "512+"]
    assert out["requests"].to_list() == [2, 1]
    # bin 0-127: live mean 2.0, sim mean 2.5 -> +25 %; TTFT 0.1 -> 0.15, +50 %; bin 512+: 2.0 -> 1.0, -50 %
    assert out["e2e_error_pct"].to_list() == pytest.approx([25.0, -50.0])
    assert out["ttft_error_pct"].to_list() == pytest.approx([50.0, -50.0])


def _fleet_args(fleet) -> list[str]:
    return [a for url in fleet.endpoints for a in ("--endpoint", url)]


def test_transfer_cli_against_emulated_instances(tmp_path):
    """Calibrated on one Poisson mix, checked on another with longer prompts: the report names the workload of
    every row, the records carry it, the residual tables cover both, and the calibrated profile is written.
    The emulated engine runs the profile's own costs, so the calibration lands near 1 and the transfer error is
    small (the bound is loose: on a loaded test machine the emulator lags real time)."""
    cal = "workload:poisson?requests=30&rate=20&seed=1&prompt_tokens=128:0.8"
    check = "workload:poisson?requests=30&rate=20&prompt_tokens=512:0.5&seed=4"
    prof = load_profile(PROFILE)
    with EmulatorFleet(FleetConfig(prof, 1)) as fleet:
        res = CliRunner().invoke(main, ["fidelity", "--profile", str(PROFILE), "--calibrate-on", cal, "--check-on",
                                        check, "--router", "round_robin", "--repeats", "2", "--format", "json",
                                        "--out", str(tmp_path / "fid"), *_fleet_args(fleet)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert out["calibrated_on"] == cal and out["calibration_fit"]["workload"] == cal
    assert [c["workload"] for c in out["checks"]] == [check]
    (row,) = out["checks"][0]["routers"]
    assert row["workload"] == check and row["router"] == "round_robin"
    assert abs(row["mean_e2e_error_pct"]) < 30 and len(row["live_mean_e2e_by_repeat_s"]) == 2
    assert row["uncalibrated_mean_e2e_error_pct"] is not None
    assert 0.5 < out["calibration"]["decode_scale"] < 2.0 and out["calibration"]["ttft_fit"] == "split"
    assert out["placement"] is None  # attached endpoints: nothing was placed here
    recs = pl.read_parquet(tmp_path / "fid" / "records.parquet")
    assert set(recs["workload"].unique()) == {cal, check}
    assert set(recs.filter(pl.col("workload") == check)["source"].unique()) == {"sim", "sim-uncalibrated",
                                                                                "live-0", "live-1", "warm-up"}
    # the default warm-up (the first 20 requests of each workload, replayed once first) is kept, and counted nowhere
    assert out["warmup_requests"] == 20
    assert recs.filter(pl.col("source") == "warm-up").group_by("workload").len()["len"].to_list() == [20, 20]
    assert recs.height == 30 * 3 + 30 * 4 + 20 * 2
    by_prompt = pl.DataFrame(out["residuals"]["prompt_tokens"])
    assert set(by_prompt["workload"]) == {cal, check}
    assert by_prompt.filter(pl.col("workload") == check)["requests"].sum() == 60  # 30 requests x 2 repeats
    assert "calibration" in load_profile(tmp_path / "fid" / "calibrated.toml").source


def test_transfer_table_says_which_workload(tmp_path):
    prof = load_profile(PROFILE)
    with EmulatorFleet(FleetConfig(prof, 1)) as fleet:
        res = CliRunner().invoke(main, ["fidelity", "--profile", str(PROFILE),
                                        "--calibrate-on", "workload:poisson?requests=20&rate=20&prompt_tokens=128:0.8",
                                        "--check-on", "workload:poisson?requests=20&rate=20&seed=9",
                                        "--router", "round_robin", "--repeats", "1", *_fleet_args(fleet)],
                                 env={"COLUMNS": "320"})
    assert res.exit_code == 0, res.output
    assert "calibrated on: workload:poisson?requests=20&rate=20&prompt_tokens=128:0.8 (fitted)" in res.output
    assert "(split TTFT fit)" in res.output
    assert "checked on: workload:poisson?requests=20&rate=20&seed=9" in res.output
    assert "residuals by prompt tokens" in res.output and "residuals by batch size" in res.output


@pytest.mark.parametrize("args, flag, problem", [
    (["--calibrate-on", "poisson", "--check-on", "workload:poisson"], "--calibrate-on", "give trace:FILE"),
    (["--calibrate-on", "workload:poisson", "--check-on", "workload:poisson?bad=1"], "--check-on",
     "unknown option 'bad'"),
    (["--check-on", "workload:poisson"], "--check-on", "needs --calibrate-on"),
    (["--calibrate-on", "workload:poisson"], "--calibrate-on", "at least one --check-on"),
    (["--calibrate-on", "workload:poisson", "--check-on", "workload:poisson"], "--check-on", "must differ"),
    (["--calibrate-on", "workload:poisson", "--check-on", "workload:paper-mix", "--trace", __file__], "--trace",
     "does not go with --calibrate-on"),
    (["--calibrate-on", "workload:poisson?prompt_tokens=abc", "--check-on", "workload:paper-mix"],
     "--calibrate-on", "prompt_tokens"),
])
def test_transfer_refusals_are_one_line_exit_2(args, flag, problem):
    res = CliRunner().invoke(main, ["fidelity", "--profile", "llama3.1-8b-a100-v0", "--endpoint",
                                    "http://127.0.0.1:9", *args])
    assert res.exit_code == 2, res.output
    error_lines = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(error_lines) == 1 and flag in error_lines[0] and problem in error_lines[0], res.output
