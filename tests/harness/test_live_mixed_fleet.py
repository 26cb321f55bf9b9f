"""Live tier: one mixed CPU fleet — two tiny vLLM instances with different engine settings (instance 1 without
chunked prefill) launched by ``lbbench run --launch-args``, 20 requests, each instance's settings in run.toml.

Needs the vLLM environment (``make vllm-env``); in CI (``CI=true``) or with ``LBBENCH_REQUIRE_LIVE=1`` its
absence is a failure, elsewhere a skip.
"""

from __future__ import annotations

import os
import subprocess
import tomllib

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.engines.vllm.launcher import find_vllm_python

pytestmark = pytest.mark.live


def _vllm_python() -> str:
    py = find_vllm_python()
    reason = "no .venv-vllm (run `make vllm-env`)" if py is None else None
    if py is not None:
        ok = subprocess.run([py, "-c", "import vllm"], capture_output=True, text=True)
        reason = None if ok.returncode == 0 else f"{py} cannot import vllm"
    if reason is not None:
        if os.environ.get("CI") == "true" or os.environ.get("LBBENCH_REQUIRE_LIVE") == "1":
            pytest.fail(f"live tier required but {reason}")
        pytest.skip(reason)
    return py


def test_a_mixed_cpu_fleet_with_and_without_chunked_prefill(tmp_path):
    py = _vllm_python()
    out = tmp_path / "run"
    res = CliRunner().invoke(main, [
        "run", "--launch", "tiny", "--instances", "2", "--launch-args", "1:--no-enable-chunked-prefill",
        "--vllm-python", py, "--workload", "poisson", "--rate", "4", "--requests", "20", "--prompt-tokens", "64",
        "--output-tokens", "16", "--router", "round_robin", "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(out / "requests.parquet")
    assert df.height == 20 and df["error"].null_count() == 20
    assert sorted(df["instance"].unique().to_list()) == [0, 1]
    doc = tomllib.loads((out / "run.toml").read_text())
    assert doc["config"]["launch_args"] == {"1": ["--no-enable-chunked-prefill"]}
    launched = doc["launched_instances"]
    assert [i["engine_args"] for i in launched] == [[], ["--no-enable-chunked-prefill"]]
    logs = sorted((out / "logs").rglob("server-1.log"))
    assert logs and "--no-enable-chunked-prefill" in logs[0].read_text().splitlines()[0]
