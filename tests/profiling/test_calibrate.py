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
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
from lbbench.profiles import load_profile
from lbbench.profiling.calibrate import Calibration, CalibrationError, calibrated_toml, fit, scaled
from lbbench.profiling.fidelity import stats
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads.poisson import poisson

SHIPPED = Path(__file__).resolve().parents[2] / "profiles" / "llama3.1-8b-a100-v0.toml"


def _requests(seed: int = 3, n: int = 120):
    return poisson(n, 12.0, seed, prompt_tokens=(512, 0.5), output_tokens=(96, 0.5))


def _sim(prof, reqs):
    return ClusterSim(prof, 2, reqs, seed=0, run_id="t").run(get_router("round_robin", num_instances=2, seed=0,
                                                                          profile=prof))


def test_scaled_multiplies_each_half_of_the_step_model_and_its_copies():
    p = load_profile("llama3.1-8b-a100-v0")
    q = scaled(p, 2.0, 3.0)
    assert q.prefill_token_s == pytest.approx(2 * p.prefill_token_s) and q.grad1 == pytest.approx(2 * p.grad1)
    assert q.base_s == pytest.approx(3 * p.base_s) and q.decode_seq_s == pytest.approx(3 * p.decode_seq_s)
    assert q.context_token_s == pytest.approx(3 * p.context_token_s) and q.grad2 == pytest.approx(3 * p.grad2)
    assert q.min_step_s == pytest.approx(3 * p.min_step_s)
    # the front end, the KV cache and the engine's limits are not step costs
    assert q.api_overhead_s == p.api_overhead_s
    assert (q.num_kv_blocks, q.max_num_seqs, q.max_num_batched_tokens) == (p.num_kv_blocks, p.max_num_seqs,
                                                                           p.max_num_batched_tokens)
    one = scaled(p, 1.5)
    assert one.prefill_token_s == pytest.approx(1.5 * p.prefill_token_s)
    assert one.base_s == pytest.approx(1.5 * p.base_s)


@pytest.mark.parametrize("true_prefill,true_decode", [(1.7, 1.7), (0.6, 2.5), (3.0, 1.2)])
def test_fit_recovers_both_factors(true_prefill, true_decode):
    p = load_profile("llama3.1-8b-a100-v0").with_overrides(api_overhead_s=0.003)
    reqs = _requests()
    live = [_sim(scaled(p, true_prefill, true_decode), reqs)]
    cal = fit(p, live, lambda prof: _sim(prof, reqs))
    assert cal.prefill_scale == pytest.approx(true_prefill, rel=0.05)
    assert cal.decode_scale == pytest.approx(true_decode, rel=0.05)
    assert cal.api_overhead_s == 0.003 and 1 <= cal.rounds
    # E2E was not fitted on, and it follows: the same model with the right parameters
    assert cal.sim_after["mean_e2e_s"] == pytest.approx(stats(live[0])["mean_e2e_s"], rel=0.03)


def test_one_factor_cannot_fit_what_two_do():
    """The reason for two factors: 'live' runs whose decode steps are slowed more than their prefills. One factor
    fitted to the TBT (the first version) then misses the TTFT; the two-factor fit gets both."""
    p = load_profile("llama3.1-8b-a100-v0").with_overrides(api_overhead_s=0.0)
    reqs = _requests()
    live = [_sim(scaled(p, 1.2, 3.0), reqs)]
    target = stats(live[0])
    cal = fit(p, live, lambda prof: _sim(prof, reqs))
    after = stats(_sim(scaled(p, cal.prefill_scale, cal.decode_scale), reqs))
    assert after["mean_ttft_s"] == pytest.approx(target["mean_ttft_s"], rel=0.03)
    assert after["mean_tbt_s"] == pytest.approx(target["mean_tbt_s"], rel=0.03)
    single = stats(_sim(scaled(p, cal.decode_scale), reqs))  # one factor, the one the TBT wants
    assert single["mean_ttft_s"] > 1.5 * target["mean_ttft_s"]


def test_fit_refuses_what_no_factor_explains():
    p = load_profile("llama3.1-8b-a100-v0")
    reqs = _requests(n=40)
    live = [_sim(scaled(p, 1.0, 100.0), reqs)]
    with pytest.raises(CalibrationError, match="live mean TBT .* outside what decode-step factors"):
        fit(p, live, lambda prof: _sim(prof, reqs), iterations=5)
    # a TTFT below the measured front end's latency: no prefill cost explains it
    slow_front = p.with_overrides(api_overhead_s=1.0)
    live = [_sim(p, reqs)]
    with pytest.raises(CalibrationError, match="live mean TTFT .* outside what prefill factors"):
        fit(slow_front, live, lambda prof: _sim(prof, reqs), iterations=5)
    with pytest.raises(CalibrationError, match="at least one live replay"):
        fit(p, [], lambda prof: _sim(prof, reqs))


def test_calibrated_toml_by_hand(tmp_path):
    doc = {"name": "m", "step": {"base_s": 0.004, "prefill_token_s": 6e-5, "decode_seq_s": 2e-4,
                                 "context_token_s": 5e-7, "api_overhead_s": 0.002},
           "mixing": {"grad1": 6e-5, "grad2": 2e-4, "epsilon": 0.05, "alpha": 0.5, "min_step_s": 0.0042},
           "source": {"base_s": "fitted"}}
    cal = Calibration(prefill_scale=2.0, decode_scale=1.5, api_overhead_s=0.002, live_mean_tbt_s=0.006,
                      live_mean_ttft_s=0.05, live_mean_e2e_s=0.4, sim_before={"mean_e2e_s": 0.3},
                      sim_after={"mean_e2e_s": 0.38})
    out = calibrated_toml(doc, cal, what="60 requests")
    assert out["step"] == {"base_s": 0.006, "prefill_token_s": 1.2e-4, "decode_seq_s": 3e-4,
                           "context_token_s": 7.5e-7, "api_overhead_s": 0.002}
    assert out["mixing"]["grad1"] == 1.2e-4 and out["mixing"]["grad2"] == 3e-4
    assert out["mixing"]["min_step_s"] == pytest.approx(0.0063)
    assert out["mixing"]["epsilon"] == 0.05
    assert out["calibration"]["prefill_scale"] == 2.0 and out["calibration"]["decode_scale"] == 1.5
    assert out["source"]["base_s"].startswith("fitted; then x1.5 (calibrated: live mean TBT")
    assert out["source"]["prefill_token_s"].startswith("as measured; then x2 (calibrated: live mean TTFT")
    assert "mean E2E not fitted" in out["source"]["calibration"]
    assert doc["step"]["base_s"] == 0.004  # the input is not modified


def test_calibrate_cli_recovers_the_emulated_engines_costs(tmp_path):
    """serve-sim instances run the shipped profile in real time; the profile given to calibrate charges half
    its step costs, so both fitted factors must come out near 2, and the calibrated profile must then simulate
    other requests (another seed) as the emulator serves them."""
    doc = tomllib.loads(SHIPPED.read_text())
    for k in ("base_s", "prefill_token_s", "decode_seq_s", "context_token_s"):
        doc["step"][k] /= 2
    half = tmp_path / "half.toml"
    half.write_text(tomli_w.dumps(doc))
    out = tmp_path / "cal.toml"
    common = ["--workload", "poisson", "--requests", "40", "--rate", "20", "--prompt-tokens", "256:0.5",
              "--output-tokens", "64:0.5"]
    with EmulatorFleet(FleetConfig(load_profile("llama3.1-8b-a100-v0"), 2)) as fleet:
        eps = [a for url in fleet.endpoints for a in ("--endpoint", url)]
        res = CliRunner().invoke(main, ["profile", "calibrate", "--profile", str(half), "--out", str(out),
                                        "--repeats", "1", *common, *eps])
        assert res.exit_code == 0, res.output
        cal = load_profile(out)
        decode = cal.base_s / doc["step"]["base_s"]
        prefill = cal.prefill_token_s / doc["step"]["prefill_token_s"]
        assert 1.4 < decode < 2.8 and 1.4 < prefill < 2.8, res.output
        assert cal.source["calibration"].startswith("lbbench profile calibrate on 40 requests (poisson, seed 1")
        res = CliRunner().invoke(main, ["fidelity", "--profile", str(out), "--router", "round_robin,jsq",
                                        "--repeats", "1", "--seed", "0", "--format", "json", *common, *eps])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output[res.output.index("{"):])
    for r in rep["routers"]:
        assert abs(r["mean_e2e_error_pct"]) < 35, r


def test_calibrate_wants_a_toml_file():
    res = CliRunner().invoke(main, ["profile", "calibrate", "--profile", "llama3.1-8b-a100-v0", "--out", "x.toml",
                                    "--endpoint", "http://127.0.0.1:9"])
    assert res.exit_code == 2 and "give the measured profile's .toml file" in res.output


def test_split_ttft_fit_recovers_a_per_request_overhead_and_the_prefill_factor():
    """A 'live' engine whose prefill costs are x2.0 the profile's and whose front end adds 30 ms to every request:
    the split fit finds both (the per-token factor and the intercept), where the mean fit folds the 30 ms into the
    per-token factor and so overcharges a workload of longer prompts."""
    from lbbench.profiling.calibrate import calibrated, fit, scaled
    from lbbench.routers import get_router
    from lbbench.sim.cluster import ClusterSim
    from lbbench.workloads import parse_length_spec, poisson

    prof = load_profile("llama3.1-8b-a100-v0")
    truth = scaled(prof, 2.0, 1.0).with_overrides(api_overhead_s=0.030)
    short = poisson(200, 4.0, 1, prompt_tokens=parse_length_spec("400:0.8", "prompt_tokens"),
                    output_tokens=parse_length_spec("64:0.5", "output_tokens"))
    long_ = poisson(200, 4.0, 2, prompt_tokens=parse_length_spec("3000:0.3", "prompt_tokens"),
                    output_tokens=parse_length_spec("64:0.5", "output_tokens"))

    def run(p, reqs):
        return ClusterSim(p, 1, reqs, seed=0, run_id="t").run(get_router("round_robin", num_instances=1, seed=0,
                                                                          profile=p))
    live = [run(truth, short)]
    split = fit(prof, live, lambda p: run(p, short), ttft="split")
    assert split.prefill_scale == pytest.approx(2.0, rel=0.15)
    assert split.api_overhead_s == pytest.approx(0.030, abs=0.008)
    mean = fit(prof, live, lambda p: run(p, short), ttft="mean")
    assert mean.api_overhead_s == prof.api_overhead_s and mean.prefill_scale > 2.3  # the 30 ms as per-token cost
    want = stats(run(truth, long_))["mean_ttft_s"]
    err_split = abs(stats(run(calibrated(prof, split), long_))["mean_ttft_s"] / want - 1)
    err_mean = abs(stats(run(calibrated(prof, mean), long_))["mean_ttft_s"] / want - 1)
    assert err_split < 0.1 < err_mean
