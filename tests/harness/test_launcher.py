"""Launcher: servers come up healthy, and every process is gone afterwards —
on normal exit, on an exception, on SIGTERM, and when a server dies early."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from lbbench.engines.vllm.emulator import free_port, free_port_range
from lbbench.engines.vllm.launcher import LaunchError, cpu_executor_for, launch, split_cores

FAKE = str(Path(__file__).with_name("fake_vllm_server.py"))


def _pids(path: Path) -> list[int]:
    return [int(p) for line in path.read_text().splitlines() for p in line.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_dead(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.fixture
def pid_file(tmp_path, monkeypatch):
    path = tmp_path / "pids"
    path.write_text("")
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(path))
    return path


def test_servers_are_healthy_then_all_gone(tmp_path, pid_file):
    port = free_port_range(2)
    with launch("some/model", 2, log_dir=tmp_path / "logs", port_base=port, health_timeout_s=30,
                command=[sys.executable, FAKE], max_num_seqs=8, chunked_prefill=False, stop_grace_s=2) as urls:
        assert urls == [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
        for u in urls:
            assert urllib.request.urlopen(u + "/health", timeout=5).status == 200
        pids = _pids(pid_file)
        assert len(pids) == 4 and all(_alive(p) for p in pids)
    assert _wait_dead(pids) == []
    log = (tmp_path / "logs" / "server-0.log").read_text()
    assert "--model some/model" in log and "--max-num-seqs 8" in log and "--no-enable-chunked-prefill" in log


def test_exception_inside_tears_down(tmp_path, pid_file):
    with pytest.raises(RuntimeError, match="boom"):
        with launch("m", 1, log_dir=tmp_path, port_base=free_port(), health_timeout_s=30,
                    command=[sys.executable, FAKE], stop_grace_s=2):
            raise RuntimeError("boom")
    assert _wait_dead(_pids(pid_file)) == []


def test_sigkill_after_grace_when_sigterm_is_ignored(tmp_path, pid_file, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_IGNORE_TERM", "1")
    t = time.monotonic()
    with launch("m", 1, log_dir=tmp_path, port_base=free_port(), health_timeout_s=30,
                command=[sys.executable, FAKE], stop_grace_s=0.5):
        pass
    assert _wait_dead(_pids(pid_file)) == []
    assert time.monotonic() - t < 15


def test_server_that_dies_early_is_reported_with_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_EXIT", "3")
    with pytest.raises(LaunchError, match=r"server 0 .* exited with code 3") as info:
        with launch("m", 1, log_dir=tmp_path, port_base=free_port(), health_timeout_s=30,
                    command=[sys.executable, FAKE]):
            pass
    assert "failing on purpose" in str(info.value)


def test_health_timeout(tmp_path, pid_file):
    port = free_port()
    # a "server" that never listens
    with pytest.raises(LaunchError, match="not healthy after 1s"):
        with launch("m", 1, log_dir=tmp_path, port_base=port, health_timeout_s=1,
                    command=[sys.executable, "-c", "import time; time.sleep(60)", "--"]):
            pass


def test_sigterm_to_the_launching_process_tears_everything_down(tmp_path, pid_file):
    script = textwrap.dedent(f"""
        import sys, time
        from lbbench.engines.vllm.launcher import launch
        with launch("m", 2, log_dir={str(tmp_path)!r}, port_base={free_port_range(2)}, health_timeout_s=30,
                    command=[sys.executable, {FAKE!r}], stop_grace_s=2) as urls:
            print("ready", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        pids = _pids(pid_file)
        assert len(pids) == 4 and all(_alive(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _wait_dead(pids) == []


def test_split_cores():
    assert split_cores([0, 1], 2) == ["0", "1"]
    assert split_cores(range(8), 3) == ["0-2", "3-5", "6-7"]
    assert split_cores([0, 2, 4, 6], 2) == ["0,2", "4,6"]
    assert split_cores([0], 2) == ["0", "0"]


def test_busy_port_is_a_clear_error(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LaunchError, match=rf"^port_base {port}: port {port} is already in use"):
            with launch("m", 1, log_dir=tmp_path, port_base=port, command=[sys.executable, FAKE]):
                pass


def test_one_server_per_gpu_pinned_to_it(tmp_path, pid_file, monkeypatch):
    import lbbench.engines.vllm.launcher as launcher

    monkeypatch.setattr(launcher, "visible_gpus", lambda: ["2", "5"])
    with launch("org/model", None, log_dir=tmp_path, port_base=free_port_range(2), health_timeout_s=30,
                command=[sys.executable, FAKE, "serve"], stop_grace_s=2) as urls:
        assert len(urls) == 2  # one per visible GPU by default
    for i, gpu in enumerate(["2", "5"]):
        log = (tmp_path / f"server-{i}.log").read_text()
        assert f"env CUDA_VISIBLE_DEVICES={gpu}" in log
        assert "env VLLM_CPU_OMP_THREADS_BIND=None" in log
        assert "--enforce-eager" not in log
        assert "serve org/model --host" in log  # `vllm serve MODEL`: positional
    with pytest.raises(LaunchError, match="^instances 3: only 2 GPU"):
        with launch("m", 3, log_dir=tmp_path, command=[sys.executable, FAKE]):
            pass


def test_cpu_servers_split_the_cores(tmp_path, pid_file, monkeypatch):
    import lbbench.engines.vllm.launcher as launcher

    monkeypatch.setattr(launcher, "visible_gpus", lambda: [])
    monkeypatch.setattr(launcher.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    with launch("m", 2, log_dir=tmp_path, port_base=free_port_range(2), health_timeout_s=30,
                command=[sys.executable, FAKE], stop_grace_s=2):
        pass
    assert "env VLLM_CPU_OMP_THREADS_BIND=0-1" in (tmp_path / "server-0.log").read_text()
    assert "env VLLM_CPU_OMP_THREADS_BIND=2-3" in (tmp_path / "server-1.log").read_text()
    assert "--enforce-eager" in (tmp_path / "server-0.log").read_text()
    # two cores per instance: vLLM's default mp executor (its CPU platform sets OpenMP up there)
    assert "--distributed-executor-backend" not in (tmp_path / "server-0.log").read_text()
    assert "env VLLM_ENABLE_V1_MULTIPROCESSING=None" in (tmp_path / "server-0.log").read_text()


def test_one_core_per_cpu_instance_runs_the_model_in_the_engine_core(tmp_path, pid_file, monkeypatch):
    import lbbench.engines.vllm.launcher as launcher

    monkeypatch.setattr(launcher, "visible_gpus", lambda: [])
    monkeypatch.setattr(launcher.os, "sched_getaffinity", lambda pid: {0, 1})
    with launch("m", 2, log_dir=tmp_path, port_base=free_port_range(2), health_timeout_s=30,
                command=[sys.executable, FAKE], stop_grace_s=2):
        pass
    for i in (0, 1):
        log = (tmp_path / f"server-{i}.log").read_text()
        assert "--distributed-executor-backend uni" in log and "env VLLM_ENABLE_V1_MULTIPROCESSING=0" in log
        assert f"env VLLM_CPU_OMP_THREADS_BIND={i}" in log


def test_cpu_executor_choice():
    assert cpu_executor_for(["0", "1"]) == "uni"
    assert cpu_executor_for(["0-1", "2-3"]) == "mp"
    assert cpu_executor_for(["0", "1", "0"]) == "mp"  # instances share a core
    assert cpu_executor_for(["0", "1"], "mp") == "mp" and cpu_executor_for(["0-3"], "uni") == "uni"
    with pytest.raises(LaunchError, match="LBBENCH_CPU_EXECUTOR=threads"):
        cpu_executor_for(["0"], "threads")
