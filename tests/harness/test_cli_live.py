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
from lbbench.harness.emulator import free_port

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
