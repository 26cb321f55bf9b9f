"""`lbbench serve-sim` and `lbbench launch` from the command line."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from click.testing import CliRunner

from lbbench.cli import main
from lbbench.engines.vllm.emulator import free_port

FAKE = str(Path(__file__).with_name("fake_vllm_server.py"))


def test_commands_are_registered():
    runner = CliRunner()
    for cmd in ("serve-sim", "launch"):
        res = runner.invoke(main, [cmd, "--help"])
        assert res.exit_code == 0, res.output
    assert "--profile" in runner.invoke(main, ["serve-sim", "--help"]).output
    assert "--chunked-prefill" in runner.invoke(main, ["launch", "--help"]).output


def test_serve_sim_bad_input_exits_2():
    runner = CliRunner()
    res = runner.invoke(main, ["serve-sim", "--profile", "no-such-profile"])
    assert res.exit_code == 2 and "--profile" in res.output
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = runner.invoke(main, ["serve-sim", "--instances", "1", "--port", str(port)])
    assert res.exit_code == 2 and f"{port}" in res.output


def test_launch_bad_input_exits_2(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["launch", "tiny", "--vllm-python", str(tmp_path / "nope"),
                               "--log-dir", str(tmp_path)])
    assert res.exit_code == 2 and "--vllm-python" in res.output


def test_serve_sim_serves_until_sigterm(tmp_path):
    port = free_port()
    eps = tmp_path / "endpoints.txt"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from lbbench.cli import main; main()", "serve-sim", "--instances", "1",
         "--profile", "zero", "--port", str(port), "--endpoints-file", str(eps)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}"
        assert eps.read_text().split() == [url]
        assert urllib.request.urlopen(url + "/health", timeout=5).status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    with socket.socket() as s:  # nothing listens there any more (TIME_WAIT aside)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def _serve_sim(port: int, profile: str = "llama3.1-8b-a100-v0") -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", "from lbbench.cli import main; main()", "serve-sim", "--instances", "1",
         "--profile", profile, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, proc.stdout.readline().strip()


def test_sigkilled_serve_sim_process_mid_run():
    """Two serve-sim processes; one is SIGKILLed mid-run: its in-flight requests
    fail with a connection error, the rest of the run completes on the other."""
    import threading

    from lbbench.core import Request
    from lbbench.harness.replay import ReplaySettings, run_replay
    from lbbench.routers import get_router

    servers = [_serve_sim(free_port()) for _ in range(2)]
    try:
        urls = [u for _, u in servers]
        assert all(u.startswith("http://") for u in urls)
        reqs = [Request(i, i / 80.0, 64, 80) for i in range(200)]  # 2.5 s at 80 req/s
        timer = threading.Timer(1.0, servers[1][0].kill)
        timer.start()
        try:
            res = run_replay(reqs, get_router("jsq", num_instances=2, seed=0), urls,
                             ReplaySettings(run_id="k", seed=0, scrape_interval_s=0.5))
        finally:
            timer.cancel()
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait(10)
    assert res.complete and len(res.records) == 200
    failed = [r for r in res.records if r.error is not None]
    assert failed and all(r.instance == 1 and "connection" in r.error for r in failed)
    assert all(r.generated_tokens == 80 for r in res.records if r.error is None)
    last_on_1 = max(r.dispatch_s for r in res.records if r.instance == 1)
    assert any(r.dispatch_s > last_on_1 + 0.5 for r in res.records)  # the run went on without it
