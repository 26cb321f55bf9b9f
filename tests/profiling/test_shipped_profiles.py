"""The shipped Llama-3.1-8B profiles are what scripts/derive_shipped_profiles.py derives now (so a change of the
shipped calibration must regenerate them: `make profiles`), they are the engine `plan` derives, and their vLLM V0
variants keep the paper's engine."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.experiment import RunConfig
from lbbench.metrics.summary import Slo
from lbbench.planning import PlanConfig
from lbbench.planning.capacity import derived_profile, tasks_for
from lbbench.profiles import available_profiles, load_profile
from lbbench.profiling.calibration import load_calibration
from lbbench.profiling.gpus import get_gpu
from lbbench.profiling.models import load_model_config
from lbbench.roofline import RooflineStepModel
from lbbench.step_model import LinearStepModel

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("derive_shipped_profiles", ROOT / "scripts" /
                                                  "derive_shipped_profiles.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["derive_shipped_profiles"] = mod
    spec.loader.exec_module(mod)
    return mod


SCRIPT = _script()


@pytest.mark.parametrize("name", sorted(SCRIPT.SHIPPED))
def test_shipped_profile_is_what_the_script_derives_now(name):
    shipped = tomllib.loads((ROOT / "profiles" / f"{name}.toml").read_text())
    assert shipped == tomllib.loads(SCRIPT.derived(name)), (
        f"profiles/{name}.toml is stale: run `make profiles` (scripts/derive_shipped_profiles.py)")
    p = load_profile(name)
    assert (p.scheduler, p.chunked_prefill) == ("v1", True) and isinstance(p.step_model, RooflineStepModel)
    assert p.efficiency == load_calibration(None).eff.as_dict()


@pytest.mark.parametrize("name", ["llama3.1-8b-a100", "llama3.1-8b-h100", "llama3.1-8b-l4"])
def test_plan_derives_the_engine_a_fleet_of_shipped_profiles_runs(name):
    """`plan` (and `plan --mix`) derive through the same function, so a plan's A100 is `--fleet
    llama3.1-8b-a100`'s: same engine, limits, KV cache and step times."""
    gpu, tp = SCRIPT.SHIPPED[name]
    planned, shipped = derived_profile(load_model_config("llama-3.1-8b"), get_gpu(gpu), tp, "bf16"), load_profile(name)
    for key in ("scheduler", "chunked_prefill", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                "num_kv_blocks", "block_size", "api_overhead_s", "roofline", "efficiency"):
        assert getattr(planned, key) == getattr(shipped, key), key
    for n in (1, 64, shipped.max_num_seqs):
        assert planned.step_time_s(512, n, 1000 * n) == shipped.step_time_s(512, n, 1000 * n)


@pytest.mark.parametrize("name", ["llama3.1-8b-a100", "llama3.1-8b-h100", "llama3.1-8b-l4", "llama3.1-8b-a100-tp2"])
def test_v0_variants_keep_the_papers_engine(name):
    v0 = load_profile(f"{name}-v0")
    assert v0.name == f"{name}-v0" and (v0.scheduler, v0.chunked_prefill, v0.max_num_seqs) == ("v0", False, 128)
    assert isinstance(v0.step_model, LinearStepModel) and f"{name}-v0" in available_profiles()


def test_plan_takes_another_calibration_and_names_a_bad_one(tmp_path):
    """`plan --calibration FILE` derives with that file's factors, as `profile derive --calibration` does; a bad
    file is one line and exit 2."""
    cal = tmp_path / "slow.toml"
    cal.write_text("[calibration]\nfitted_on = \"a test\"\n[efficiency]\nweight_bw_util = 0.35\n"
                   "[front_end]\napi_overhead_s = 0.0\n")
    run = RunConfig(workload="paper-mix", rate_per_s=20, requests=50, routers=["jsq"])
    cfg = PlanConfig(run=run, model="llama-3.1-8b", gpus=["a100-80gb"], slo=Slo(ttft_s=2), calibration=str(cal))
    (task,), _ = tasks_for(cfg, lambda _msg: None)
    shipped = load_profile("llama3.1-8b-a100")
    assert task.profile.efficiency["weight_bw_util"] == 0.35 and task.profile.api_overhead_s == 0.0
    # half the weight-read bandwidth: a single-sequence step (weight reads, mostly) is markedly slower
    assert task.profile.step_model.decode_s(1) > 1.5 * shipped.step_model.decode_s(1)
    bad = tmp_path / "bad.toml"
    bad.write_text("[efficiency]\nsharpness = 0.5\n")
    res = CliRunner().invoke(main, ["plan", "--rate", "20", "--slo", "ttft=2", "--model", "llama-3.1-8b", "--gpu",
                                    "a100-80gb", "--calibration", str(bad)])
    assert res.exit_code == 2 and "bad.toml" in res.output and len(res.output.strip().splitlines()) == 1
