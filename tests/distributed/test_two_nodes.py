"""Ray across nodes: a head and a second node on this machine, every address on loopback.

A small simulated sweep goes through ``lbbench run --ray`` as a user types it: its units run on both nodes and
``run.toml`` names each unit's node; killing the second node while it runs a task retries that task on the head,
and the records equal a one-process run's. The cluster uses a token of its own (``ray_cluster.start_head``), so
the runs also show ``connect`` turning token mode on for a cluster that asks for one (and refusing in one
line when no token is at hand). This is the test of the
two-machine recipe in ``docs/scale-out.md`` (the same ``ray start`` commands, one machine).

Without the ray extra it skips, except in CI (``CI`` set), where the extra is installed and it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

#: 2 rates x 2 routers x 2 instance schedulers x 2 seeds = 16 units
SWEEP = ["run", "--profile", "llama2-7b-v100", "--instances", "4", "--workload", "paper-mix", "--rate", "15,30",
         "--router", "round_robin,jsq", "--instance-scheduler", "fcfs,least_work_left", "--seeds", "2",
         "--requests", "600", "--format", "json"]
UNITS = 16


def _lbbench(args: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return subprocess.Popen([sys.executable, "-m", "lbbench.cli", *args], env={**base, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _finish(proc: subprocess.Popen, timeout_s: float = 240) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, f"lbbench run exited {proc.returncode}: {err[-3000:]}"
    return out, err


def _records(run: Path) -> pl.DataFrame:
    return pl.read_parquet(run / "requests.parquet").drop("run_id")


@pytest.fixture(scope="module")
def rc(ray_module):
    from lbbench.distributed import ray_cluster
    return ray_cluster


@pytest.fixture(scope="module")
def serial_proc(tmp_path_factory):
    """The one-process reference run, started before the cluster so that the two overlap."""
    out = tmp_path_factory.mktemp("serial") / "run"
    proc = _lbbench([*SWEEP, "--jobs", "1", "--out", str(out)])
    yield proc, out
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def cluster(rc, serial_proc):
    """A head (1 CPU) and a second node ``node1`` (1 CPU), both on loopback; torn down whatever happens."""
    c = rc.start_head(1, name="head")
    try:
        rc.start_worker(c, 1, name="node1")
        yield c
    finally:
        rc.stop(c)
        assert not rc._pids_mentioning(str(c.temp_dir)), "a process of the test cluster outlived stop()"


@pytest.fixture(scope="module")
def serial_run(serial_proc):
    proc, out = serial_proc
    _finish(proc)
    return out


def _node1(rc, cluster):
    """The cluster's second node, started again if an earlier test killed it."""
    node = next((n for n in cluster.nodes if n.name == "node1" and n.alive), None)
    return node or rc.start_worker(cluster, 1, name="node1")


def test_a_sweep_runs_on_both_nodes_and_names_them(rc, cluster, serial_run, tmp_path):
    _node1(rc, cluster)
    out = tmp_path / "run"
    # as docs/scale-out.md says: RAY_ADDRESS and --ray auto; the token is at hand, RAY_AUTH_MODE is not set
    _, err = _finish(_lbbench([*SWEEP, "--ray", "auto", "--out", str(out)], cluster.client_env()))
    assert err.count("uses token authentication; using the token from") == 1, err[-2000:]
    doc = tomllib.loads((out / "run.toml").read_text())
    assert doc["complete"] is True and doc["executor"] == "ray" and doc["ray_cpus"] == 2
    per_node = {row["node"]: row["units"] for row in doc["ray_nodes"]}
    assert set(per_node) == {"head", "node1"} and sum(per_node.values()) == UNITS, per_node
    assert all(n > 0 for n in per_node.values()), per_node
    assert len(doc["unit_nodes"]) == UNITS and set(doc["unit_nodes"].values()) == {"head", "node1"}
    assert_frame_equal(_records(out), _records(serial_run), check_exact=True)


def test_a_cluster_that_asks_for_a_token_none_here_is_one_line(cluster, tmp_path):
    # no token anywhere: HOME without ~/.ray, no RAY_AUTH_TOKEN(_PATH)
    run = _lbbench([*SWEEP, "--ray", cluster.address, "--out", str(tmp_path / "run")], {"HOME": str(tmp_path)})
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2, err[-2000:]
    assert f"the Ray cluster at {cluster.address} uses token authentication and no token is set here" in err
    assert "RAY_AUTH_MODE=token" in err and not (tmp_path / "run" / "requests.parquet").exists()


def _running_task_pids(node) -> list[int]:
    """Ray workers of ``node`` (its session) running a task now (their title names the task)."""
    pids = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if os.getsid(int(d.name)) != node.proc.pid:
                continue
            if (d / "cmdline").read_bytes().startswith(b"ray::run_batch_on_node"):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def test_killing_the_second_node_mid_sweep_retries_its_units_on_the_head(rc, cluster, serial_run, tmp_path):
    node = _node1(rc, cluster)
    out = tmp_path / "run"
    run = _lbbench([*SWEEP, "--ray", cluster.address, "--out", str(out)],
                   {"RAY_AUTH_TOKEN_PATH": str(cluster.token_path)})
    busy: list[int] = []
    deadline = time.monotonic() + 180
    while run.poll() is None and time.monotonic() < deadline and not busy:
        busy = _running_task_pids(node)
        time.sleep(0.05)
    assert busy, "the second node never ran a task of the sweep"
    cluster.kill_node(node)  # the whole node at once, as a machine dies
    assert run.poll() is None, "the run ended before the node was killed"
    _finish(run)
    doc = tomllib.loads((out / "run.toml").read_text())
    assert doc["complete"] is True and doc["runs_completed"] == UNITS
    nodes = doc["unit_nodes"]
    assert len(nodes) == UNITS and set(nodes.values()) <= {"head", "node1"}
    assert list(nodes.values()).count("head") > UNITS // 2, nodes  # the head took over the second node's share
    assert_frame_equal(_records(out), _records(serial_run), check_exact=True)
