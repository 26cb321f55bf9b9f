"""Live tier: an emulated prefill/decode fleet (``lbbench serve-sim --fleet NAME:1:prefill,NAME:1:decode``)
speaking llm-d's P/D sidecar protocol, replayed with pair routers through ``lbbench run --endpoint`` and through
``lbbench proxy``.

Every process is started from the command line, as a user would; no GPU, no vLLM. Behaviour, not timing, is
asserted (the host may be a noisy 2-core machine): every request completes, each was prefilled on the prefill
instance and decoded on the decode instance (the records, and the instances' own request counters: the prefill
instance answers one token per prefill leg), and the TTFT split is recorded and in causal order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest

from lbbench.engines.vllm.emulator import free_port, free_port_range
from lbbench.live.metrics import parse_metrics

pytestmark = pytest.mark.live

PROFILE = "llama3.1-8b-a100"
N = 16  # requests per router
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B in bf16


def _lbbench(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.Popen([sys.executable, "-m", "lbbench", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _run(*args: str, timeout_s: float = 90) -> str:
    p = _lbbench(*args)
    out, err = p.communicate(timeout=timeout_s)
    assert p.returncode == 0, out + err
    return out


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _wait_health(url: str, timeout_s: float = 30) -> None:
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not come up")


def _successes(url: str) -> tuple[int, int]:
    """(requests finished, tokens generated) that the instance itself counted (vLLM's metric names)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    ok = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line.startswith("vllm:request_success_total"))
    gen = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("vllm:generation_tokens_total"))
    assert parse_metrics(text) is not None
    return int(ok), int(gen)


@pytest.fixture(scope="module")
def pd_fleet(tmp_path_factory):
    """``lbbench serve-sim`` with one prefill and one decode instance; yields its two ``URL@PROFILE:ROLE``."""
    eps = tmp_path_factory.mktemp("pd") / "eps.txt"
    port = free_port_range(2)
    proc = _lbbench("serve-sim", "--fleet", f"{PROFILE}:1:prefill,{PROFILE}:1:decode", "--kv-link", "rdma-400g",
                    "--port", str(port), "--endpoints-file", str(eps))
    try:
        t_end = time.monotonic() + 30
        while not (eps.exists() and len(eps.read_text().split()) == 2):
            assert proc.poll() is None and time.monotonic() < t_end, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.2)
        lines = eps.read_text().split()
        assert lines == [f"http://127.0.0.1:{port}@{PROFILE}:prefill", f"http://127.0.0.1:{port + 1}@{PROFILE}:decode"]
        yield lines, eps
    finally:
        _stop(proc)


def test_pair_routers_replay_through_run_endpoint(pd_fleet, tmp_path):
    (pre, dec), eps = pd_fleet
    pre_url, dec_url = pre.split("@")[0], dec.split("@")[0]
    before = _successes(pre_url), _successes(dec_url)
    out = tmp_path / "run"
    _run("run", "--endpoints", str(eps), "--router", "pd_llmd_always,pd_vllm", "--workload", "poisson",
         "--rate", "4", "--requests", str(N), "--prompt-tokens", "1200:0.5", "--output-tokens", "16:1.0",
         "--prompt-mode", "ids", "--out", str(out), "--format", "json")  # ids: no probe request to count
    df = pl.read_parquet(out / "requests.parquet")
    assert df.height == 2 * N and df["error"].null_count() == 2 * N  # every request completed
    assert (df["generated_tokens"] == df["output_tokens"]).all()
    # each prefilled on instance 0, decoded on instance 1, as these routers always disaggregate on 1P+1D
    assert df["prefill_instance"].to_list() == [0] * (2 * N) and df["instance"].to_list() == [1] * (2 * N)
    # the instances saw it so: one prefill leg (one token) per request, every request decoded
    after = _successes(pre_url), _successes(dec_url)
    assert after[0][0] - before[0][0] == 2 * N and after[0][1] - before[0][1] == 2 * N
    assert after[1][0] - before[1][0] == 2 * N
    # the TTFT split, in causal order on the client's clock, and the bytes moved
    for c in ("prefill_done_s", "kv_ready_s", "decode_admit_s", "transfer_bytes"):
        assert df[c].null_count() == 0, c
    assert (df["dispatch_s"] <= df["prefill_done_s"]).all()
    assert (df["prefill_done_s"] < df["kv_ready_s"]).all()  # a transfer takes at least the link's latency
    assert (df["kv_ready_s"] <= df["decode_admit_s"]).all()
    assert (df["decode_admit_s"] <= df["first_token_s"]).all()
    assert (df["transfer_bytes"] == (df["prompt_tokens"] - 1) * KV_BYTES_PER_TOKEN).all()


def test_pair_router_in_lbbench_proxy(pd_fleet, tmp_path):
    (pre, dec), _ = pd_fleet
    pre_url, dec_url = pre.split("@")[0], dec.split("@")[0]
    before = _successes(pre_url), _successes(dec_url)
    port = free_port()
    proxy = _lbbench("proxy", "--endpoint", pre, "--endpoint", dec, "--router", "pd_llmd_always", "--port",
                     str(port))
    try:
        _wait_health(f"http://127.0.0.1:{port}")
        out = tmp_path / "via-proxy"
        _run("run", "--endpoint", f"http://127.0.0.1:{port}@{PROFILE}", "--router", "round_robin", "--workload",
             "poisson", "--rate", "4", "--requests", str(N), "--prompt-tokens", "1200:0.5", "--output-tokens",
             "16:1.0", "--prompt-mode", "ids", "--out", str(out), "--format", "json")
    finally:
        _stop(proxy)
    df = pl.read_parquet(out / "requests.parquet")
    assert df.height == N and df["error"].null_count() == N
    after = _successes(pre_url), _successes(dec_url)
    assert after[0][0] - before[0][0] == N and after[1][0] - before[1][0] == N  # each through both instances
    # the decode instance's split, passed on by the gateway (the client does not know the prefill instance)
    assert df["prefill_instance"].null_count() == N
    assert df["kv_ready_s"].null_count() == 0 and (df["kv_ready_s"] <= df["first_token_s"]).all()
    assert (df["transfer_bytes"] == (df["prompt_tokens"] - 1) * KV_BYTES_PER_TOKEN).all()
