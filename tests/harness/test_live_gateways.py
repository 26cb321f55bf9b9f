"""Live tier: `lbbench run --endpoint GATEWAY` through production gateways — SGLang's model gateway (`smg`,
which takes only text prompts) and vllm-router — in front of two real vLLM CPU instances: every request
completes, and through `smg` the text prompts reach vLLM at exactly the asked length.

Needs ``.venv-vllm`` and ``.venv-gateways`` (``make vllm-env gateways-env``); skipped without them unless
``LBBENCH_REQUIRE_LIVE=1`` or ``CI`` makes that a failure.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from harness.test_live_vllm import _vllm_python_or_skip
from lbbench.cli import main
from lbbench.engines.vllm.emulator import free_port, free_port_range
from lbbench.engines.vllm.launcher import launch

pytestmark = pytest.mark.live
GATEWAYS = Path(__file__).resolve().parents[2] / ".venv-gateways" / "bin"


def _gateway_bin(name: str) -> str:
    exe = GATEWAYS / name
    if not exe.is_file():
        if os.environ.get("CI") or os.environ.get("LBBENCH_REQUIRE_LIVE") == "1":
            pytest.fail(f"live tier required (CI or LBBENCH_REQUIRE_LIVE=1) but {exe} is missing "
                        "(make gateways-env)")
        pytest.skip(f"{exe} missing (make gateways-env)")
    return str(exe)


@contextlib.contextmanager
def _gateway(exe: str, workers: list[str], policy: str, log: Path):
    port = free_port()
    cmd = [exe, "launch"] if exe.endswith("smg") else [exe]
    cmd += ["--worker-urls", *workers, "--port", str(port), "--prometheus-port", str(free_port()),
            "--policy", policy]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{exe} did not come up: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        time.sleep(2.0)  # let the gateway's own health checks mark the workers up
        yield url
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def _run(gw: str, out: Path, *extra: str):
    res = CliRunner().invoke(main, ["run", "--endpoint", gw, "--model", "tiny", "--profile", "llama3.1-8b-a100-v0",
                                    "--workload", "poisson", "--rate", "4", "--requests", "20",
                                    "--prompt-tokens", "96", "--output-tokens", "12", "--out", str(out),
                                    "--format", "json", *extra])
    assert res.exit_code == 0, res.output
    return pl.read_parquet(out / "requests.parquet"), res.output


def test_lbbench_through_sglang_gateway_and_vllm_router(tmp_path):
    _vllm_python_or_skip()
    smg, vrouter = _gateway_bin("smg"), _gateway_bin("vllm-router")
    with launch("tiny", 2, log_dir=tmp_path / "logs", port_base=free_port_range(2),
                extra_args=["--no-enable-prefix-caching"]) as urls:
        with _gateway(smg, urls, "round_robin", tmp_path / "smg.log") as gw:
            df, output = _run(gw, tmp_path / "smg", "--tokenizer", urls[0])
            assert "sending text prompts (exact lengths)" in output
            assert df["error"].null_count() == df.height == 20
            assert (df["server_prompt_tokens"] == df["prompt_tokens"]).all()
            assert (df["generated_tokens"] == df["output_tokens"]).all()
        with _gateway(vrouter, urls, "power_of_two", tmp_path / "vllm-router.log") as gw:
            df, _ = _run(gw, tmp_path / "vllm-router")
            assert df["error"].null_count() == df.height == 20
            assert (df["server_prompt_tokens"] == df["prompt_tokens"]).all()
