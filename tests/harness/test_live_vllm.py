"""Live tier: real vLLM (CPU build) serving the tiny model, two instances.

Needs the vLLM environment (``make vllm-env`` builds ``.venv-vllm``). Without it
the test is skipped, unless ``LBBENCH_REQUIRE_LIVE=1`` or ``CI`` makes that a failure.
Replays a short slice of the Azure conversation trace (``shared/traces`` beside
the repository, or ``$LBBENCH_TRACE_DIR``) through ``round_robin`` and ``jsq``. Without
the trace, a synthetic slice with a warning, unless ``CI`` or ``LBBENCH_REQUIRE_SHARED=1``
makes that a failure.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from lbbench.core import Request
from lbbench.engines.vllm.emulator import free_port_range
from lbbench.engines.vllm.launcher import find_vllm_python, launch
from lbbench.harness.replay import ReplaySettings, run_replay
from lbbench.routers import get_router

pytestmark = pytest.mark.live

NUM_REQUESTS = 30
MAX_PROMPT_TOKENS = 256
MAX_OUTPUT_TOKENS = 32


def _vllm_python_or_skip() -> str:
    reason = None
    py = find_vllm_python()
    if py is None:
        reason = "no .venv-vllm (run `make vllm-env`)"
    else:
        ok = subprocess.run([py, "-c", "import vllm"], capture_output=True, text=True)
        if ok.returncode != 0:
            reason = f"{py} cannot import vllm: {ok.stderr.strip().splitlines()[-1:]}"
    if reason is not None:
        if os.environ.get("CI") or os.environ.get("LBBENCH_REQUIRE_LIVE") == "1":
            pytest.fail(f"live tier required (CI or LBBENCH_REQUIRE_LIVE=1) but {reason}")
        pytest.skip(reason)
    return py


TRACE_DIR = Path(os.environ.get("LBBENCH_TRACE_DIR",
                               Path(__file__).resolve().parents[2].parent / "shared" / "traces"))


def _slice() -> tuple[list[Request], str]:
    path = TRACE_DIR / "AzureLLMInferenceTrace_conv.csv"
    if not path.is_file():
        missing = f"{path} is missing (shared/traces beside the repository, or LBBENCH_TRACE_DIR)"
        if os.environ.get("CI") or os.environ.get("LBBENCH_REQUIRE_SHARED") == "1":
            pytest.fail(f"shared data required (CI or LBBENCH_REQUIRE_SHARED=1) but {missing}")
        warnings.warn(f"{missing}: replaying a synthetic slice instead", stacklevel=2)
    if path.is_file():
        from lbbench.workloads.traces import load_trace_requests
        reqs = load_trace_requests(path, max_prompt_tokens=MAX_PROMPT_TOKENS, requests=NUM_REQUESTS, rate=5.0)
        source = path.name
    else:
        rng = np.random.default_rng(0)
        arrivals = np.cumsum(rng.exponential(0.2, NUM_REQUESTS))
        reqs = [Request(i, float(arrivals[i]), int(rng.integers(8, MAX_PROMPT_TOKENS)),
                        int(rng.integers(1, 200))) for i in range(NUM_REQUESTS)]
        source = "synthetic"
    return [dataclasses.replace(r, output_tokens=min(r.output_tokens, MAX_OUTPUT_TOKENS)) for r in reqs], source


def test_tiny_model_on_two_vllm_cpu_instances(tmp_path):
    py = _vllm_python_or_skip()
    requests, source = _slice()
    assert len(requests) == NUM_REQUESTS
    with launch("tiny", 2, vllm_python=py, log_dir=tmp_path / "logs", port_base=free_port_range(2),
                health_timeout_s=600, max_num_seqs=32) as endpoints:
        for name in ("round_robin", "jsq"):
            router = get_router(name, num_instances=2, seed=0)
            res = run_replay(requests, router, endpoints,
                             ReplaySettings(run_id=f"live-{name}", seed=0, out_dir=tmp_path / name,
                                            scrape_interval_s=0.5, request_timeout_s=120))
            assert res.complete, f"{name} on {source}: incomplete"
            assert res.model == "tiny"
            assert len(res.records) == NUM_REQUESTS
            for rec in res.records:
                assert rec.error is None, f"{name}: request {rec.request_id}: {rec.error}"
                assert rec.http_status == 200
                # exact lengths, as the client and the server counted them
                assert rec.generated_tokens == rec.output_tokens == rec.server_output_tokens
                assert rec.server_prompt_tokens == rec.prompt_tokens
                times = res.token_times[rec.request_id]
                assert len(times) == rec.output_tokens
                # TTFT and E2E agree with the streamed tokens
                assert rec.first_token_s == times[0]
                assert rec.actual_send_s <= rec.first_token_s <= times[-1] <= rec.finish_s
                ttft_s = rec.first_token_s - rec.arrival_s
                e2e_s = rec.finish_s - rec.arrival_s
                assert 0 < ttft_s <= e2e_s < 60
                assert e2e_s - (times[-1] - rec.arrival_s) < 1.0
            assert {r.instance for r in res.records} == {0, 1}
            m = res.metrics
            assert m.height > 0 and set(m["instance"].unique()) == {0, 1}
            assert m["num_running"].max() >= 1
    assert (tmp_path / "logs" / "server-0.log").stat().st_size > 0
