"""Mixed fleets through the CLI: ``run --fleet``, ``headroom --fleet``, ``serve-sim --fleet`` with
``run --endpoint URL@PROFILE``, per-instance engine arguments of ``--launch``, and every bad input in one line."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.engines.vllm.emulator import free_port_range
from lbbench.experiment import ConfigError, RunConfig
from lbbench.experiment.config import split_endpoint

MIXED = "llama3.1-8b-a100-v0:2,llama3.1-8b-l4-v0:2"


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_run_on_a_mixed_fleet_records_each_instances_profile_and_lists_the_fleet(tmp_path):
    out = tmp_path / "run"
    res = invoke("run", "--fleet", MIXED, "--workload", "paper-mix", "--rate", "50", "--requests", "200",
                 "--router", "round_robin,least_work_speed", "--out", str(out))
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(out / "requests.parquet")
    by_instance = dict(df.select("instance", "instance_profile").unique().iter_rows())
    assert by_instance == {0: "llama3.1-8b-a100-v0", 1: "llama3.1-8b-a100-v0", 2: "llama3.1-8b-l4-v0",
                           3: "llama3.1-8b-l4-v0"}
    assert df["profile"].unique().to_list() == ["a100-v0x2+l4-v0x2"] and df["num_instances"].unique().to_list() == [4]
    doc = tomllib.loads((out / "run.toml").read_text())
    assert doc["fleet"]["spec"] == MIXED and doc["fleet"]["num_instances"] == 4
    assert [(e["profile"], e["count"]) for e in doc["fleet"]["entries"]] == [("llama3.1-8b-a100-v0", 2),
                                                                            ("llama3.1-8b-l4-v0", 2)]
    assert doc["config"]["profile"] == "llama3.1-8b-a100-v0" and doc["config"]["instances"] == 4
    assert "Per instance" in res.stdout and "busy fraction" in res.stdout
    # the speed-aware router sends the slower L4s less than round robin's even quarter
    lws = df.filter(pl.col("router") == "least_work_speed")
    assert lws.filter(pl.col("instance_profile") == "llama3.1-8b-l4-v0").height < 100
    report = invoke("report", str(out))
    assert report.exit_code == 0 and "busy fraction" in report.output and "llama3.1-8b-l4-v0" in report.output


def test_a_uniform_fleet_is_the_profile_and_instances_shorthand(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert invoke("run", "--fleet", "llama2-7b-v100:3", "--requests", "60", "--out", str(a)).exit_code == 0
    assert invoke("run", "--profile", "llama2-7b-v100", "--instances", "3", "--requests", "60",
                  "--out", str(b)).exit_code == 0
    da, db = (pl.read_parquet(p / "requests.parquet").drop("run_id") for p in (a, b))
    assert da.equals(db) and da["instance_profile"].unique().to_list() == ["llama2-7b-v100"]
    assert "Per instance" not in invoke("run", "--requests", "20", "--out", str(b)).stdout


@pytest.mark.parametrize("spec, says", [
    ("llama3.1-8b-a100-v0:2,nonexistent-gpu:2", "unknown profile 'nonexistent-gpu'"),
    ("llama3.1-8b-a100-v0:0", "count must be a positive integer, not 0"),
    ("llama3.1-8b-a100-v0:-1", "count must be a positive integer, not -1"),
    ("llama2-7b-v100:1,llama3.1-8b-a100-v0:1", "one fleet serves one model"),
    ("llama3.1-8b-a100-v0", "not NAME_OR_PATH:COUNT"),
    ("llama3.1-8b-a100-v0:two", "count 'two' is not an integer"),
    ("llama3.1-8b-a100-v0:1,,llama3.1-8b-l4-v0:1", "is empty"),
])
@pytest.mark.parametrize("command", ["run", "headroom"])
def test_a_bad_fleet_is_one_line_and_exit_2(command, spec, says, tmp_path):
    res = invoke(command, "--fleet", spec, "--requests", "10", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and res.output.startswith("Error: --fleet: ") and says in res.output


def test_fleet_with_profile_or_instances_is_refused(tmp_path):
    for extra in (["--instances", "3"], ["--profile", "llama3.1-8b-l4-v0"]):
        res = invoke("run", "--fleet", MIXED, *extra, "--out", str(tmp_path / "r"))
        assert res.exit_code == 2 and res.output.count("\n") == 1 and "not both" in res.output


def test_a_bad_endpoint_profile_is_one_line_and_exit_2(tmp_path):
    res = invoke("run", "--endpoint", "http://127.0.0.1:9@nonexistent", "--requests", "5",
                 "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert res.output.startswith("Error: --endpoint: http://127.0.0.1:9@nonexistent: unknown profile")
    res = invoke("run", "--endpoint", "http://127.0.0.1:9@llama2-7b-v100", "--endpoint",
                 "http://127.0.0.1:10@llama3.1-8b-a100-v0", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "one fleet serves one model" in res.output


def test_endpoint_profiles_split_from_the_url():
    assert split_endpoint("http://h:8000@llama3.1-8b-l4-v0") == ("http://h:8000", "llama3.1-8b-l4-v0")
    assert split_endpoint("http://h:8000/v1@p.toml") == ("http://h:8000/v1", "p.toml")
    assert split_endpoint("http://h:8000") == ("http://h:8000", None)
    cfg = RunConfig(endpoints=["http://a@llama3.1-8b-a100-v0", "http://b", "http://c@llama3.1-8b-l4-v0"],
                    profile="llama3.1-8b-a100-v0").resolved()
    assert cfg.endpoint_urls() == ["http://a", "http://b", "http://c"]
    assert [p.name for p in cfg.fleet_of().profiles()] == ["llama3.1-8b-a100-v0", "llama3.1-8b-a100-v0",
                                                            "llama3.1-8b-l4-v0"]


def test_launch_args_are_checked_before_anything_starts(tmp_path):
    res = invoke("run", "--launch-args", "1:--no-enable-chunked-prefill", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "--launch-args: only for launched servers" in res.output
    res = invoke("run", "--launch", "tiny", "--instances", "2", "--launch-args", "2:--max-num-seqs 4",
                 "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and "--launch-args: no instance 2 among 2" in res.output
    res = invoke("run", "--launch", "tiny", "--launch-args", "--max-num-seqs 4", "--out", str(tmp_path / "r"))
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "expected I:ARGS" in res.output
    with pytest.raises(ConfigError, match="launch_args"):
        RunConfig(launch_args={0: ["--x"]}).resolved()._check_live()


def test_router_run_notes_reach_the_cli(tmp_path):
    res = invoke("run", "--fleet", "llama3.1-8b-a100-v0:1,llama3.1-8b-l4-v0:1", "--router", "predicted_latency",
                 "--requests", "120", "--rate", "20", "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    assert "predicted_latency: routed its first" in res.output and "MAPE" in res.output


def test_headroom_runs_the_planner_on_a_mixed_fleet(tmp_path):
    out = tmp_path / "h"
    res = invoke("headroom", "--fleet", "llama3.1-8b-a100-v0:1,llama3.1-8b-l4-v0:1", "--rate", "20", "--requests", "40",
                 "--seeds", "1", "--tuning-seeds", "1", "--no-reorder", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "fleet a100-v0x1+l4-v0x1" in res.output and "lookahead (oracle)" in res.output
    planner = next(p for p in out.iterdir() if p.is_dir() and "planner" in p.name)
    assert tomllib.loads((planner / "run.toml").read_text())["fleet"]["spec"] == "llama3.1-8b-a100-v0:1,llama3.1-8b-l4-v0:1"


def test_serve_sim_fleet_and_run_on_its_endpoints_with_their_profiles(tmp_path):
    eps = tmp_path / "eps.txt"
    port = free_port_range(2)
    server = subprocess.Popen([sys.executable, "-m", "lbbench.cli", "serve-sim", "--fleet",
                               "llama3.1-8b-a100-v0:1,llama3.1-8b-l4-v0:1", "--port", str(port), "--endpoints-file",
                               str(eps)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (eps.is_file() and eps.read_text().count("\n") == 2):
            assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()
            time.sleep(0.1)
        lines = eps.read_text().split()
        assert lines == [f"http://127.0.0.1:{port}@llama3.1-8b-a100-v0", f"http://127.0.0.1:{port + 1}@llama3.1-8b-l4-v0"]
        out = tmp_path / "run"
        res = invoke("run", "--endpoint", lines[0], "--endpoint", lines[1], "--workload", "poisson", "--rate", "10",
                     "--requests", "20", "--router", "round_robin", "--out", str(out))
        assert res.exit_code == 0, res.output
        df = pl.read_parquet(out / "requests.parquet")
        assert df["error"].null_count() == 20
        assert dict(df.select("instance", "instance_profile").unique().iter_rows()) == {
            0: "llama3.1-8b-a100-v0", 1: "llama3.1-8b-l4-v0"}
        doc = tomllib.loads((out / "run.toml").read_text())
        assert doc["fleet"]["spec"] == "llama3.1-8b-a100-v0:1,llama3.1-8b-l4-v0:1"
    finally:
        server.terminate()
        server.wait(30)


def test_serve_sim_refuses_a_bad_fleet(tmp_path):
    res = invoke("serve-sim", "--fleet", "llama3.1-8b-a100-v0:0")
    assert res.exit_code == 2 and "--fleet" in res.output and "positive integer" in res.output
    res = invoke("serve-sim", "--fleet", MIXED, "--instances", "2")
    assert res.exit_code == 2 and "not both" in res.output
