"""Live tier: measure a profile from real vLLM (CPU build, tiny model, two instances), calibrate it on one set of
requests, and check the simulator's fidelity on another: the mean E2E error of every router must stay within the
issue's 15 %.

The calibration fits a factor on the measured decode-step costs to the live mean time between tokens and one on
the prefill costs to the live mean time to first token (``lbbench profile calibrate``, seed 1); the gated E2E is
fitted on neither, and the evaluated requests (seed 0) are not the calibration's. When that first measurement is
over the gate, calibration and evaluation are repeated once on fresh sets (seeds 2 and 3) and the second must pass:
the host's speed drifts between the two phases (see ``_calibrate_and_check``'s caller). Without the calibration, the
sweep-measured profile alone was 57-80 % off on a 2-core host (docs/fidelity.md).

Needs ``.venv-vllm`` (``make vllm-env``); skipped without it unless ``LBBENCH_REQUIRE_LIVE=1``.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from harness.test_live_vllm import _vllm_python_or_skip
from lbbench.cli import main
from lbbench.engines.vllm.emulator import free_port_range
from lbbench.profiles import load_profile

pytestmark = pytest.mark.live
MAX_ERROR_PCT = 15.0
#: the benchmark's Poisson mix (docs/fidelity.md), 300 requests (75 s) a replay, 3 replays on each side. With 100
#: requests this gate failed once in CI: replays of one request set drifted by up to 19 % there, and the simulated
#: mean TBT of 100-request sets ranged over +-10 % from seed to seed (the chance overlap of prefills with decodes),
#: which a calibration on one such set carries to the next; at 300 requests the latter is +-4 % (docs/fidelity.md).
WORKLOAD = ["--workload", "poisson", "--prompt-tokens", "256:0.5", "--output-tokens", "64:0.5", "--requests", "300",
            "--rate", "4", "--repeats", "3"]


def test_measure_calibrate_then_fidelity_on_real_vllm(tmp_path):
    _vllm_python_or_skip()
    prof_path = tmp_path / "tiny.toml"
    res = CliRunner().invoke(main, ["profile", "measure", "--launch", "tiny", "--instances", "2",
                                    "--port", str(free_port_range(2)), "--out", str(prof_path),
                                    "--log-dir", str(tmp_path / "measure-logs")])
    assert res.exit_code == 0, res.output
    prof = load_profile(prof_path)
    assert prof.block_size > 0 and prof.num_kv_blocks > 0 and prof.base_s > 0
    assert prof.source["num_kv_blocks"].startswith("read from the engine")

    first = _calibrate_and_check(tmp_path / "a", prof_path, calibration_seed=1, evaluation_seed=0)
    if all(abs(r["mean_e2e_error_pct"]) <= MAX_ERROR_PCT for r in first):
        return
    # One more measurement, on fresh request sets on both sides. On this shared 2-core host the engines' speed
    # drifts between the calibration's replays and the evaluation's a few minutes later (CI once saw both routers
    # off by 13.5-15.7 % in the same direction, decode steps over-charged by the same 13.9 %); a real fidelity
    # regression fails both measurements, host drift rarely does twice.
    print(f"first measurement over {MAX_ERROR_PCT} %: {[round(r['mean_e2e_error_pct'], 2) for r in first]}; "
          "measuring again on fresh seeds")
    second = _calibrate_and_check(tmp_path / "b", prof_path, calibration_seed=2, evaluation_seed=3)
    for r in second:
        assert abs(r["mean_e2e_error_pct"]) <= MAX_ERROR_PCT, (r, first)


def _calibrate_and_check(tmp_path, prof_path, calibration_seed: int, evaluation_seed: int) -> list[dict]:
    """Calibrate the measured profile on one request set, then replay another live and in the simulator;
    the per-router fidelity rows."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cal_path = tmp_path / "tiny-cal.toml"
    res = CliRunner().invoke(main, ["profile", "calibrate", "--profile", str(prof_path), "--launch", "tiny",
                                    "--instances", "2", "--port-base", str(free_port_range(2)), *WORKLOAD,
                                    "--seed", str(calibration_seed), "--out", str(cal_path),
                                    "--log-dir", str(tmp_path / "cal-logs")])
    print(res.output)
    assert res.exit_code == 0, res.output
    assert f"seed {calibration_seed}" in load_profile(cal_path).source["calibration"]

    res = CliRunner().invoke(main, [
        "fidelity", "--profile", str(cal_path), "--launch", "tiny", "--instances", "2",
        "--port-base", str(free_port_range(2)), *WORKLOAD, "--seed", str(evaluation_seed),
        "--router", "round_robin,jsq", "--format", "json", "--log-dir", str(tmp_path / "fidelity-logs")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    print(json.dumps(out, indent=1))
    return out["routers"]
