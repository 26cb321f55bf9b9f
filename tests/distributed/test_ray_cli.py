"""``lbbench run --ray``: end to end on a tiny sweep (joining the session's running cluster through RAY_ADDRESS, as
`--ray auto` joins one started with `ray start --head`), one line for a missing extra or an address that does not
answer, and the note on live runs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tomllib

import polars as pl
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from lbbench.cli.main import main
from lbbench.distributed import ray_cluster

TINY = ["run", "--rate", "10,20", "--router", "round_robin,jsq", "--requests", "80", "--seeds", "2",
        "--format", "json"]


def test_run_ray_auto_end_to_end_equals_one_process(ray_session, tmp_path):
    here = CliRunner().invoke(main, [*TINY, "--jobs", "1", "--out", str(tmp_path / "one")], catch_exceptions=False)
    assert here.exit_code == 0, here.output
    # `--ray auto` honours RAY_ADDRESS: point it at this session's cluster (not another one on the machine);
    # Ray sends its token to an address it is given only with RAY_AUTH_MODE=token
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address, "RAY_AUTH_MODE": "token"}
    res = subprocess.run([sys.executable, "-m", "lbbench.cli", *TINY, "--ray", "auto", "--out", str(tmp_path / "ray")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = tomllib.loads((tmp_path / "ray" / "run.toml").read_text())
    assert doc["executor"] == "ray" and doc["complete"] is True and doc["runs_completed"] == 8
    assert doc["ray_cpus"] == 2  # this session's cluster
    for name in ("requests", "summary"):
        a = pl.read_parquet(tmp_path / "one" / f"{name}.parquet").drop("run_id", strict=False)
        b = pl.read_parquet(tmp_path / "ray" / f"{name}.parquet").drop("run_id", strict=False)
        assert_frame_equal(a, b, check_exact=True)


def test_ray_without_the_extra_is_one_line_and_exit_2(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where the extra is not installed
    res = CliRunner().invoke(main, [*TINY, "--ray", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert res.output.strip() == "Error: --ray: needs the ray extra: pip install 'lbbench[ray]'"
    assert not (tmp_path / "x").exists()  # refused before any work


def test_ray_on_a_live_run_says_it_replays_here(tmp_path):
    res = CliRunner().invoke(main, ["run", "--endpoint", "http://127.0.0.1:9", "--requests", "5", "--ray",
                                    "--out", str(tmp_path / "x")])
    note = res.output.splitlines()[0]
    assert note.startswith("note: --ray") and "replays from this process" in note


def _no_init(**kw):
    raise AssertionError("ray.init must not be tried on an address that is not there")


def test_an_unreachable_ray_address_is_one_line_and_exit_2(monkeypatch, tmp_path):
    fake_ray = type("FakeRay", (), {"is_initialized": staticmethod(lambda: False), "init": staticmethod(_no_init)})
    monkeypatch.setattr(ray_cluster, "require_ray", lambda: fake_ray)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = CliRunner().invoke(main, [*TINY, "--ray", f"127.0.0.1:{port}", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert res.output.strip() == f"Error: --ray: cannot reach the Ray cluster at 127.0.0.1:{port}: Connection refused"
    monkeypatch.setenv("RAY_ADDRESS", "nohost")
    res = CliRunner().invoke(main, [*TINY, "--ray", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert res.output.strip() == "Error: --ray: nohost (from RAY_ADDRESS) is not auto, HOST:PORT or ray://HOST:PORT"
    assert not (tmp_path / "x").exists()
