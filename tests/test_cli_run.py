"""`lbbench run` end to end through the CLI."""

import json

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main

KEYS = {"router", "seeds", "mean_e2e_s", "mean_e2e_std_s", "improvement_vs_round_robin_pct", "p50_e2e_s",
        "p90_e2e_s", "p99_e2e_s", "mean_ttft_s", "mean_tbt_s", "p99_tbt_s", "mean_router_wait_s",
        "preemptions", "throughput_tokens_per_s", "completed"}


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_run_json_has_the_documented_keys_and_writes_the_run_dir(tmp_path):
    out = tmp_path / "run"
    res = invoke("run", "--router", "round_robin,jsq", "--requests", "200", "--seeds", "2", "--rate", "10",
                 "--out", str(out), "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["router"] for r in rows] == ["round_robin", "jsq"]
    for r in rows:
        assert KEYS <= set(r)
        assert r["seeds"] == 2 and r["completed"] + r.get("failed", 0) == 400
    assert rows[0]["improvement_vs_round_robin_pct"] == 0
    df = pl.read_parquet(out / "requests.parquet")
    assert df.height == 800 and set(df["router"].unique()) == {"round_robin", "jsq"}
    assert {"profile", "workload", "num_instances", "backend"} <= set(df.columns)
    assert (out / "summary.parquet").exists() and "complete = true" in (out / "run.toml").read_text()
    assert (out / "timeline.parquet").exists()


def test_paired_seeds_give_every_router_the_same_arrivals(tmp_path):
    res = invoke("run", "--router", "round_robin,random", "--requests", "100", "--out", str(tmp_path / "r"),
                 "--format", "json")
    assert res.exit_code == 0
    df = pl.read_parquet(tmp_path / "r" / "requests.parquet").sort("request_id")
    a = df.filter(pl.col("router") == "round_robin")
    b = df.filter(pl.col("router") == "random")
    assert a["arrival_s"].to_list() == b["arrival_s"].to_list()
    assert a["output_tokens"].to_list() == b["output_tokens"].to_list()


def test_same_seed_same_records(tmp_path):
    for d in ("a", "b"):
        assert invoke("run", "--router", "jsq", "--requests", "150", "--out", str(tmp_path / d)).exit_code == 0
    a = pl.read_parquet(tmp_path / "a" / "requests.parquet").drop("run_id")
    b = pl.read_parquet(tmp_path / "b" / "requests.parquet").drop("run_id")
    assert a.equals(b)


def test_paper_classes_rows_carry_the_order(tmp_path):
    res = invoke("run", "--instances", "2", "--workload", "paper-classes", "--requests", "120",
                 "--router", "round_robin,dedicated_small_large", "--instance-scheduler", "fcfs,least_work_left",
                 "--out", str(tmp_path / "c"), "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["order"] for r in rows} == {"lh_hl_random", "all_random", "lh_then_hl", "hl_then_lh"}
    assert len(rows) == 4 * 2 * 2
    res = invoke("run", "--instances", "2", "--workload", "paper-classes", "--requests", "60",
                 "--order", "lh_then_hl", "--out", str(tmp_path / "d"), "--format", "json")
    assert {r["order"] for r in json.loads(res.stdout)} == {"lh_then_hl"}


@pytest.mark.parametrize("args,needle", [
    (["--router", "nope"], "--router"),
    (["--profile", "nope"], "--profile"),
    (["--instance-scheduler", "lifo"], "--instance-scheduler"),
    (["--order", "lh_then_hl"], "--order"),
    (["--trace", "/nonexistent/trace.csv"], "--trace"),
    (["--predictor", "psychic"], "--predictor"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, tmp_path):
    res = CliRunner().invoke(main, ["run", "--requests", "10", "--out", str(tmp_path / "x"), *args])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert needle in lines[-1]


def test_trace_replay_through_the_simulator(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" +
                     "\n".join(f"{i * 0.1},{20 + i},{10 + i}" for i in range(50)))
    res = invoke("run", "--trace", str(trace), "--router", "round_robin,jsq", "--out", str(tmp_path / "t"),
                 "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert all(r["completed"] == 50 for r in rows)


def test_listing_commands():
    res = invoke("routers", "--format", "json")
    names = {r["name"] for r in json.loads(res.stdout)}
    assert {"round_robin", "jsq", "min_min", "mcu"} <= names
    res = invoke("profiles", "--format", "json")
    assert {"llama2-7b-v100", "llama3.1-8b-a100-v0"} <= {r["name"] for r in json.loads(res.stdout)}


def test_router_options_reach_the_router_and_bad_ones_exit_2(tmp_path):
    res = invoke("run", "--router", "round_robin,late_binding_srpt", "--router-opt",
                 "late_binding_srpt.max_wait_s=30", "--requests", "100", "--out", str(tmp_path / "o"),
                 "--format", "json")
    assert res.exit_code == 0, res.output
    assert "max_wait_s" in (tmp_path / "o" / "run.toml").read_text()
    for bad in ("late_binding_srpt.bogus=1", "jsq.x=1", "nodot"):
        r = CliRunner().invoke(main, ["run", "--router", "late_binding_srpt", "--router-opt", bad,
                                      "--requests", "10", "--out", str(tmp_path / "b")])
        assert r.exit_code == 2 and "--router-opt" in r.output.strip().splitlines()[-1]


def test_profiles_ship_inside_the_package():
    """Installed (non-editable) copies find profiles through lbbench/_profiles."""
    from pathlib import Path

    import lbbench
    shipped = {p.stem for p in (Path(lbbench.__file__).parent / "_profiles").glob("*.toml")}
    assert {"llama2-7b-v100", "llama3.1-8b-a100-v0"} <= shipped


SWEEP = ["--router", "round_robin,least_requests", "--instance-scheduler", "fcfs,priority", "--requests", "120",
         "--predictor", "noisy:0.79", "--timeline-interval", "0"]


def test_load_sweep_in_parallel_processes_equals_one_rate_at_a_time(tmp_path):
    res = invoke("run", *SWEEP, "--rate", "4,30", "--jobs", "2", "--out", str(tmp_path / "sweep"),
                 "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert sorted({r["rate_per_s"] for r in rows}) == [4.0, 30.0] and len(rows) == 2 * 2 * 2
    sweep = pl.read_parquet(tmp_path / "sweep" / "requests.parquet").drop("run_id")
    for rate in ("4", "30"):
        assert invoke("run", *SWEEP, "--rate", rate, "--out", str(tmp_path / rate)).exit_code == 0
        alone = pl.read_parquet(tmp_path / rate / "requests.parquet").drop("run_id")
        part = sweep.filter(pl.col("rate_per_s") == float(rate)).select(alone.columns)
        assert part.height == 4 * 120 and part.equals(alone)
    # overload queues more than light load
    by_rate = {r["rate_per_s"]: r for r in rows if r["router"] == "round_robin" and r["instance_scheduler"] == "fcfs"}
    assert by_rate[30.0]["mean_e2e_s"] > by_rate[4.0]["mean_e2e_s"]


def test_slo_goodput_and_the_strongest_baseline_in_run_json(tmp_path):
    res = invoke("run", *SWEEP, "--rate", "30", "--slo", "ttft=1,e2e=20", "--out", str(tmp_path / "s"),
                 "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    df = pl.read_parquet(tmp_path / "s" / "requests.parquet")
    for r in rows:
        assert {"goodput_per_s", "slo_attainment", "router_wait_max_s", "makespan_s", "best_baseline",
                "vs_best_baseline_pct"} <= set(r)
        part = df.filter((pl.col("router") == r["router"]) & (pl.col("instance_scheduler") == r["instance_scheduler"]))
        ttft = part["first_token_s"] - part["arrival_s"]
        e2e = part["finish_s"] - part["arrival_s"]
        met = int(((ttft <= 1) & (e2e <= 20) & part["error"].is_null()).sum())
        makespan = part["finish_s"].max() - part["arrival_s"].min()
        assert r["slo_attainment"] == pytest.approx(met / 120)
        assert r["goodput_per_s"] == pytest.approx(met / makespan)
        assert r["makespan_s"] == pytest.approx(makespan)
        assert r["router_wait_max_s"] == pytest.approx((part["dispatch_s"] - part["arrival_s"]).max())
    best = min(rows, key=lambda r: r["mean_e2e_s"])
    assert {r["best_baseline"] for r in rows} == {f"{best['router']}/{best['instance_scheduler']}"}
    assert best["vs_best_baseline_pct"] == 0


def test_wait_bound_through_the_cli(tmp_path):
    res = invoke("run", "--router", "late_binding_srpt", "--router-opt", "late_binding_srpt.max_wait_s=5",
                 "--rate", "40", "--requests", "300", "--predictor", "noisy:0.79", "--out", str(tmp_path / "w"),
                 "--format", "json")
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert 0 < row["router_wait_max_s"] <= 5 + 0.02 + 1e-9  # + one decision interval (min_step_s)


@pytest.mark.parametrize("args,needle", [
    (["--rate", "5,x"], "--rate"), (["--rate", "0"], "--rate"), (["--slo", "ttft=fast"], "--slo"),
    (["--slo", "latency=3"], "--slo"), (["--rate", "2,-5", "--endpoint", "http://127.0.0.1:9"], "--rate"),
])
def test_bad_sweep_and_slo_flags_exit_2(args, needle, tmp_path):
    res = CliRunner().invoke(main, ["run", "--requests", "10", "--out", str(tmp_path / "x"), *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output.strip().splitlines()[-1]


def test_missing_checkpoint_names_the_flag_and_the_path_given(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    res = CliRunner().invoke(main, ["run", "--router", "wgrl", "--checkpoint", f"wgrl={missing}",
                                    "--requests", "5", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [f"Error: --checkpoint: no policy.npz at {missing}"]
