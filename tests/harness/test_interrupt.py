"""Ctrl-C / SIGTERM during a replay keep every finished request and mark the
run incomplete."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    from lbbench.core import Request
    from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
    from lbbench.harness.replay import ReplaySettings, run_replay
    from lbbench.profiles import load_profile
    from lbbench.routers import get_router

    out_dir = sys.argv[1]
    reqs = [Request(i, 0.02 * i, 64, 30) for i in range(1000)]   # 20 s of arrivals
    with EmulatorFleet(FleetConfig(load_profile("llama3.1-8b-a100-v0"), 2)) as fleet:
        def progress(done, total):
            if done >= 20:
                print("progress", flush=True)
        res = run_replay(reqs, get_router("round_robin", num_instances=2, seed=0), fleet.endpoints,
                         ReplaySettings(run_id="i", seed=0, out_dir=out_dir, progress=progress))
    print(json.dumps({"complete": res.complete, "interrupted": res.interrupted,
                      "records": len(res.records), "ok": sum(r.error is None for r in res.records)}),
          flush=True)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_keeps_finished_requests(tmp_path, sig):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "progress"
        time.sleep(0.3)
        proc.send_signal(sig)
        lines = [x for x in proc.stdout.read().splitlines() if x.startswith("{")]
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    result = json.loads(lines[-1])
    assert result["complete"] is False and result["interrupted"] == sig.name
    assert 20 <= result["records"] < 1000 and result["ok"] == result["records"]
    saved = [json.loads(x) for x in (tmp_path / "requests.partial.jsonl").read_text().splitlines()]
    assert len(saved) == result["records"]
    assert all(r["error"] is None and r["generated_tokens"] == 30 for r in saved)
