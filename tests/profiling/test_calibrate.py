"""Calibration: the two fits recover known values from simulated 'live' runs, the TOML rewrite by hand, and the
command end to end against emulated instances whose true costs are twice the profile's."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import tomli_w
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.harness.emulator import EmulatorFleet, FleetConfig
from lbbench.profiles import load_profile
from lbbench.profiling.calibrate import Calibration, CalibrationError, calibrated_toml, fit, scaled
from lbbench.profiling.fidelity import stats
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads.poisson import poisson

SHIPPED = Path(__file__).resolve().parents[2] / "profiles" / "llama3.1-8b-a100.toml"


def _requests(seed: int = 3, n: int = 120):
    return poisson(n, 12.0, seed, prompt_tokens=(512, 0.5), output_tokens=(96, 0.5))


def _sim(prof, reqs):
    return ClusterSim(prof, 2, reqs, seed=0, run_id="t").run(get_router("round_robin", num_instances=2, seed=0,
                                                                          profile=prof))


def test_scaled_multiplies_every_step_cost_and_its_copies():
    p = load_profile("llama3.1-8b-a100")
    q = scaled(p, 2.0, 0.005)
    assert q.base_s == pytest.approx(2 * p.base_s) and q.prefill_token_s == pytest.approx(2 * p.prefill_token_s)
    assert q.decode_seq_s == pytest.approx(2 * p.decode_seq_s)
    assert q.context_token_s == pytest.approx(2 * p.context_token_s)
    assert q.grad1 == pytest.approx(2 * p.grad1) and q.grad2 == pytest.approx(2 * p.grad2)
    assert q.min_step_s == pytest.approx(2 * p.min_step_s) and q.api_overhead_s == 0.005
    # the KV cache and the engine's limits are not step costs
    assert (q.num_kv_blocks, q.max_num_seqs, q.max_num_batched_tokens) == (p.num_kv_blocks, p.max_num_seqs,
                                                                           p.max_num_batched_tokens)


@pytest.mark.parametrize("true_scale,true_api", [(1.7, 0.004), (0.6, 0.0)])
def test_fit_recovers_the_scale_and_the_front_end_latency(true_scale, true_api):
    p = load_profile("llama3.1-8b-a100").with_overrides(api_overhead_s=0.0)
    reqs = _requests()
    live = [_sim(scaled(p, true_scale, true_api), reqs)]
    cal = fit(p, live, lambda prof: _sim(prof, reqs))
    assert cal.step_scale == pytest.approx(true_scale, rel=0.02)
    assert cal.api_overhead_s == pytest.approx(true_api, abs=0.002)
    # E2E was not fitted on, and it follows: the same model with the right parameters
    assert cal.sim_after["mean_e2e_s"] == pytest.approx(stats(live[0])["mean_e2e_s"], rel=0.03)


def test_fit_refuses_what_no_scale_explains():
    p = load_profile("llama3.1-8b-a100")
    reqs = _requests(n=40)
    live = [_sim(scaled(p, 100.0), reqs)]
    with pytest.raises(CalibrationError, match="outside what step scales"):
        fit(p, live, lambda prof: _sim(prof, reqs), iterations=5)
    with pytest.raises(CalibrationError, match="at least one live replay"):
        fit(p, [], lambda prof: _sim(prof, reqs))


def test_calibrated_toml_by_hand(tmp_path):
    doc = {"name": "m", "step": {"base_s": 0.004, "prefill_token_s": 6e-5, "decode_seq_s": 2e-4,
                                 "context_token_s": 5e-7, "api_overhead_s": 0.002},
           "mixing": {"grad1": 6e-5, "grad2": 2e-4, "epsilon": 0.05, "alpha": 0.5, "min_step_s": 0.0042},
           "source": {"base_s": "fitted"}}
    cal = Calibration(step_scale=1.5, api_overhead_s=0.01, live_mean_tbt_s=0.006, live_mean_ttft_s=0.05,
                      live_mean_e2e_s=0.4, sim_before={"mean_e2e_s": 0.3}, sim_after={"mean_e2e_s": 0.38})
    out = calibrated_toml(doc, cal, what="60 requests")
    assert out["step"] == {"base_s": 0.006, "prefill_token_s": 9e-5, "decode_seq_s": 3e-4,
                           "context_token_s": 7.5e-7, "api_overhead_s": 0.01}
    assert out["mixing"]["grad1"] == 9e-5 and out["mixing"]["min_step_s"] == pytest.approx(0.0063)
    assert out["mixing"]["epsilon"] == 0.05
    assert out["calibration"]["step_scale"] == 1.5
    assert out["source"]["base_s"].startswith("fitted; then x1.5 (calibrated")
    assert "mean E2E not fitted" in out["source"]["calibration"]
    assert doc["step"]["base_s"] == 0.004  # the input is not modified


def test_calibrate_cli_recovers_the_emulated_engines_costs(tmp_path):
    """serve-sim instances run the shipped profile in real time; the profile given to calibrate charges half
    its step costs, so the fitted scale must come out near 2, and the calibrated profile must then simulate other
    requests (another seed) as the emulator serves them."""
    doc = tomllib.loads(SHIPPED.read_text())
    for k in ("base_s", "prefill_token_s", "decode_seq_s", "context_token_s"):
        doc["step"][k] /= 2
    half = tmp_path / "half.toml"
    half.write_text(tomli_w.dumps(doc))
    out = tmp_path / "cal.toml"
    common = ["--workload", "poisson", "--requests", "40", "--rate", "20", "--prompt-tokens", "256:0.5",
              "--output-tokens", "64:0.5"]
    with EmulatorFleet(FleetConfig(load_profile("llama3.1-8b-a100"), 2)) as fleet:
        eps = [a for url in fleet.endpoints for a in ("--endpoint", url)]
        res = CliRunner().invoke(main, ["profile", "calibrate", "--profile", str(half), "--out", str(out),
                                        "--repeats", "1", *common, *eps])
        assert res.exit_code == 0, res.output
        cal = load_profile(out)
        scale = cal.base_s / (doc["step"]["base_s"])
        assert 1.4 < scale < 2.8, res.output
        assert cal.source["calibration"].startswith("lbbench profile calibrate on 40 requests (poisson, seed 1")
        res = CliRunner().invoke(main, ["fidelity", "--profile", str(out), "--router", "round_robin,jsq",
                                        "--repeats", "1", "--seed", "0", "--format", "json", *common, *eps])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output[res.output.index("{"):])
    for r in rep["routers"]:
        assert abs(r["mean_e2e_error_pct"]) < 35, r


def test_calibrate_wants_a_toml_file():
    res = CliRunner().invoke(main, ["profile", "calibrate", "--profile", "llama3.1-8b-a100", "--out", "x.toml",
                                    "--endpoint", "http://127.0.0.1:9"])
    assert res.exit_code == 2 and "give the measured profile's .toml file" in res.output
