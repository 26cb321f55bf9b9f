"""Fidelity: the comparison arithmetic by hand, and the whole path (live HTTP replay vs simulator) end to end
against emulated instances, which time requests with the simulator's own instance model."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.core import RequestRecord
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
from lbbench.profiles import load_profile
from lbbench.profiling.fidelity import compare, e2e_mape_pct, kendall_tau


def test_kendall_tau_by_hand():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    # pairs (1,2) concordant, (1,3) concordant, (2,3) discordant: (2 - 1) / 3
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)


def _rec(i: int, e2e: float, ttft: float, router: str = "r") -> RequestRecord:
    return RequestRecord(run_id="t", router=router, seed=0, request_id=i, task=None, instance=0, arrival_s=0.0,
                         dispatch_s=0.0, first_token_s=ttft, finish_s=e2e, prompt_tokens=1, output_tokens=2,
                         generated_tokens=2, tbt_mean_s=e2e - ttft)


def test_errors_mape_and_spread_by_hand():
    sim = {"a": [_rec(0, 1.0, 0.1), _rec(1, 3.0, 0.3)]}
    live = {"a": [[_rec(0, 2.0, 0.2), _rec(1, 2.0, 0.2)],   # mean E2E 2.0
                  [_rec(0, 1.0, 0.2), _rec(1, 3.0, 0.2)]]}  # mean E2E 2.0
    tau, (row,) = compare(["a"], sim, live)
    assert row.live["mean_e2e_s"] == pytest.approx(2.0) and row.sim["mean_e2e_s"] == pytest.approx(2.0)
    assert row.mean_e2e_error_pct == pytest.approx(0.0)
    assert row.live_spread_pct == pytest.approx(0.0)
    # repeat 1: (|1-2|/2 + |3-2|/2) / 2 = 50 %; repeat 2: exact, 0 %; mean 25 %
    assert row.e2e_mape_pct == pytest.approx(25.0)
    assert e2e_mape_pct(sim["a"], live["a"][1]) == pytest.approx(0.0)
    # TTFT: sim mean 0.2, live 0.2
    assert row.ttft_mean_error_pct == pytest.approx(0.0)
    # live against live: repeat 1 vs 2 is (|2-1|/1 + |2-3|/3) / 2 = 66.7 %, 2 vs 1 is (0.5 + 0.5) / 2 = 50 %
    assert row.live_repeat_mape_pct == pytest.approx((200 / 3 + 50) / 2)
    assert compare(["a"], sim, {"a": live["a"][:1]})[1][0].live_repeat_mape_pct is None


def test_one_disturbed_repeat_of_three_does_not_move_the_live_side():
    """The live side is the median repeat: a replay whose steps the host doubled for a while moves it not at all
    (a mean of three would move by a third of the excess), and the spread still shows it."""
    sim = {"a": [_rec(0, 1.0, 0.1), _rec(1, 1.0, 0.1)]}
    live = {"a": [[_rec(0, 1.0, 0.1), _rec(1, 1.0, 0.1)],   # mean E2E 1.0
                  [_rec(0, 2.0, 0.1), _rec(1, 2.6, 0.1)],   # disturbed: mean E2E 2.3
                  [_rec(0, 1.1, 0.1), _rec(1, 1.1, 0.1)]]}  # mean E2E 1.1
    _, (row,) = compare(["a"], sim, live)
    assert row.live["mean_e2e_s"] == pytest.approx(1.1)  # median of 1.0, 2.3, 1.1
    assert row.mean_e2e_error_pct == pytest.approx(100 * (1.0 - 1.1) / 1.1)
    assert row.live_spread_pct == pytest.approx(100 * (2.3 - 1.0) / (4.4 / 3))  # (max - min) / mean
    assert row.live_mean_e2e_by_repeat_s == pytest.approx([1.0, 2.3, 1.1])


def test_fidelity_cli_against_emulated_instances(tmp_path):
    """serve-sim instances run the simulator's instance model behind real HTTP streams in real time, so the
    simulated and the 'live' numbers must agree (the bound is loose because on a loaded test machine the
    emulator and the client lag behind real time; a unit or pairing mistake is far outside it)."""
    prof = load_profile("llama3.1-8b-a100-v0")
    with EmulatorFleet(FleetConfig(prof, 2)) as fleet:
        args = ["fidelity", "--profile", "llama3.1-8b-a100-v0", "--workload", "poisson", "--requests", "40",
                "--rate", "30", "--prompt-tokens", "256:0.5", "--output-tokens", "48:0.5",
                "--router", "round_robin,jsq", "--repeats", "2", "--format", "json", "--max-error-pct", "40", "--out", str(tmp_path / "fid")]
        for url in fleet.endpoints:
            args += ["--endpoint", url]
        res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert set(out) >= {"rank_tau", "routers"}
    for r in out["routers"]:
        assert set(r) >= {"router", "live_mean_e2e_s", "sim_mean_e2e_s", "live_spread_pct", "mean_e2e_error_pct",
                          "e2e_mape_pct", "ttft_mean_error_pct", "tbt_mean_error_pct"}
        assert abs(r["mean_e2e_error_pct"]) < 40 and r["e2e_mape_pct"] < 60
        assert len(r["live_mean_e2e_by_repeat_s"]) == 2
    import polars as pl
    recs = pl.read_parquet(tmp_path / "fid" / "records.parquet")
    assert sorted(recs["source"].unique().to_list()) == ["live-0", "live-1", "sim"]
    assert recs.height == 40 * 2 * 3
    assert json.loads((tmp_path / "fid" / "fidelity.json").read_text())["rank_tau"] == out["rank_tau"]


def test_fidelity_needs_one_kind_of_backend():
    res = CliRunner().invoke(main, ["fidelity", "--profile", "llama3.1-8b-a100-v0"])
    assert res.exit_code == 2 and "--endpoint" in res.output
