"""The CPU launcher lowers the priority of vLLM's model workers (which poll between steps) so that the front
ends and the client are not starved on a machine with no spare cores."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lbbench.engines.vllm.launcher import deprioritize_workers

NAMED = ("import ctypes, time; ctypes.CDLL(None).prctl(15, b'VLLM::Worker', 0, 0, 0); time.sleep(30)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_in_the_group_get_a_lower_priority():
    worker = subprocess.Popen([sys.executable, "-c", NAMED], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        time.sleep(0.5)  # let it rename itself
        before = os.getpriority(os.PRIO_PROCESS, worker.pid)
        assert deprioritize_workers(worker.pid, increment=5) == 1
        assert os.getpriority(os.PRIO_PROCESS, worker.pid) == min(19, before + 5)
        # a process of another group, or not named as a worker, is left alone
        assert deprioritize_workers(other.pid, increment=5) == 0
        assert os.getpriority(os.PRIO_PROCESS, other.pid) == before
    finally:
        worker.kill()
        other.kill()
        worker.wait()
        other.wait()
