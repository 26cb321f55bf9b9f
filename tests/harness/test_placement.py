"""Placement of CPU instances on cores no two share: the layout arithmetic, the refusal of a layout the machine
cannot hold (one line, exit 2), the launched server and the client really bound to their cores, and the placement
recorded in run.toml."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from lbbench.cli import main
from lbbench.engines.vllm.emulator import free_port
from lbbench.engines.vllm.launcher import LaunchError, launch, placement_of
from lbbench.engines.vllm.placement import PlacementError, cores_label, plan_placement, shared_placement

FAKE = str(Path(__file__).with_name("fake_vllm_server.py"))
CORES = sorted(os.sched_getaffinity(0))


@given(cores=st.sets(st.integers(0, 63), min_size=1, max_size=24), instances=st.integers(1, 8),
       per=st.integers(1, 6))
def test_layout_is_disjoint_or_refused(cores, instances, per):
    if instances * per + 1 > len(cores):
        with pytest.raises(PlacementError, match="cpus_per_instance"):
            plan_placement(sorted(cores), instances, per)
        return
    p = plan_placement(sorted(cores), instances, per)
    used = [c for block in p.instance_cores for c in block]
    assert all(len(block) == per for block in p.instance_cores)
    assert len(set(used)) == len(used) == instances * per  # no two instances share a core
    assert set(p.client_cores) == set(cores) - set(used) and p.client_cores  # the client gets the rest
    assert p.pinned


def test_two_core_machine_by_hand():
    p = plan_placement([0, 1], 1, 1)
    assert p.as_dict() == {"pinned": True, "instance_cores": ["0"], "client_cores": "1", "front_end": "client"}
    assert p.front_end_cores(0) == (1,)
    assert plan_placement([0, 1], 1, 1, front_end="instance").front_end_cores(0) == (0,)
    q = plan_placement([0, 1, 2, 3], 2, 1, front_end="client")
    assert q.front_end_cores(0) == q.front_end_cores(1) == (2, 3) and q.instance_cores == ((0,), (1,))
    with pytest.raises(PlacementError, match="front_end: 'gpu' must be one of instance, client"):
        plan_placement([0, 1], 1, 1, front_end="gpu")
    with pytest.raises(PlacementError, match=r"2 instance\(s\) x 1 core\(s\) \+ 1 core for the client need 3 "
                                             r"cores; this process may use 2 \(0-1\)"):
        plan_placement([0, 1], 2, 1)
    assert cores_label([4, 5, 6]) == "4-6" and cores_label([0, 2]) == "0,2" and cores_label([3]) == "3"
    assert shared_placement(["0", "1"], [0, 1]).as_dict() == {"pinned": False, "instance_cores": ["0", "1"],
                                                               "client_cores": "0-1", "front_end": "instance"}


def test_cli_refuses_a_layout_the_machine_cannot_hold(tmp_path):
    # one instance on every core leaves none for the client: refused before anything starts
    res = CliRunner().invoke(main, ["launch", "tiny", "--instances", "1", "--cpus-per-instance", str(len(CORES)),
                                    "--log-dir", str(tmp_path)])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: --cpus-per-instance: 1 instance(s) x"), res.output
    assert f"this process may use {len(CORES)}" in lines[0]


def test_fidelity_refuses_the_layout_too(tmp_path):
    res = CliRunner().invoke(main, ["fidelity", "--profile", "llama3.1-8b-a100-v0", "--launch", "tiny",
                                    "--instances", str(len(CORES)), "--cpus-per-instance", "1",
                                    "--log-dir", str(tmp_path)])
    assert res.exit_code == 2 and "--cpus-per-instance" in res.output and "for the client" in res.output


def test_launch_refuses_before_starting_anything(tmp_path):
    with pytest.raises(LaunchError, match="cpus_per_instance"):
        with launch("m", 2, log_dir=tmp_path, port_base=free_port(), command=[sys.executable, FAKE],
                    cpus_per_instance=len(CORES)):
            pass
    assert not (tmp_path / "server-0.log").exists()


@pytest.mark.skipif(len(CORES) < 2, reason="pinning an instance and the client needs two cores")
@pytest.mark.parametrize("front_end", ["client", "instance"])
def test_pinned_server_and_client_really_run_on_their_cores(tmp_path, monkeypatch, front_end):
    pid_file = tmp_path / "pids"
    pid_file.write_text("")
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(pid_file))
    monkeypatch.setattr("lbbench.engines.vllm.launcher.visible_gpus", lambda: [])  # CPU instances
    before = os.sched_getaffinity(0)
    with launch("m", 1, log_dir=tmp_path, port_base=free_port(), health_timeout_s=30,
                command=[sys.executable, FAKE], stop_grace_s=2, cpus_per_instance=1, front_end=front_end) as urls:
        server, child = (int(p) for p in pid_file.read_text().split())
        # the server process stands for the API server, its child for the engine core
        api_cores = set(CORES[1:]) if front_end == "client" else {CORES[0]}
        assert os.sched_getaffinity(server) == api_cores
        assert {os.sched_getaffinity(int(t)) == api_cores for t in os.listdir(f"/proc/{server}/task")} == {True}
        assert os.sched_getaffinity(child) == {CORES[0]}  # the engine keeps the instance's cores
        assert os.sched_getaffinity(0) == set(CORES[1:])  # the client runs on the rest
        assert placement_of(urls) == {"pinned": True, "instance_cores": [str(CORES[0])],
                                      "client_cores": cores_label(CORES[1:]), "front_end": front_end}
    assert os.sched_getaffinity(0) == before
    log = (tmp_path / "server-0.log").read_text()
    assert f"env VLLM_CPU_OMP_THREADS_BIND={CORES[0]}" in log


@pytest.mark.skipif(len(CORES) < 2, reason="pinning an instance and the client needs two cores")
def test_run_toml_records_the_placement(tmp_path, monkeypatch):
    """`lbbench run --launch ... --cpus-per-instance 1` with a stand-in server: run.toml says which cores."""
    import lbbench.engines.vllm.launcher as launcher_mod

    real_launch = launcher_mod.launch
    seen = {}

    def fake_launch(model, instances=None, **kw):
        seen["cpus_per_instance"] = kw.get("cpus_per_instance")
        return real_launch(model, instances, **{**kw, "command": [sys.executable, FAKE], "stop_grace_s": 2,
                                                "port_base": free_port(), "health_timeout_s": 30})

    import lbbench.experiment.backends as backends_mod

    monkeypatch.setattr(backends_mod, "launch", fake_launch)  # where the live backend looks it up
    monkeypatch.setattr(launcher_mod, "visible_gpus", lambda: [])
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["run", "--launch", "some-model", "--instances", "1", "--cpus-per-instance", "1",
                                    "--workload", "poisson", "--requests", "2", "--rate", "5", "--out", str(out)])
    # the stand-in answers /health only, so the replay's requests fail; the run directory is written all the same
    assert seen["cpus_per_instance"] == 1, res.output
    doc = tomllib.loads((out / "run.toml").read_text())
    assert doc["config"]["cpus_per_instance"] == 1
    assert doc["placement"] == {"pinned": True, "instance_cores": [str(CORES[0])],
                                "client_cores": cores_label(CORES[1:]), "front_end": "client"}


def test_cpus_per_instance_needs_launch():
    res = CliRunner().invoke(main, ["run", "--endpoint", "http://127.0.0.1:9", "--cpus-per-instance", "1"])
    assert res.exit_code == 2 and "--cpus-per-instance" in res.output
