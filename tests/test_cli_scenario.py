"""Scenario files (``lbbench run --config``) and re-runs (``lbbench run --from``), through the CLI."""

from __future__ import annotations

import dataclasses
import tomllib

import click
import polars as pl
import pytest
import tomli_w
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from lbbench.cli import main
from lbbench.cli.run import config_from_flags, run_cmd
from lbbench.cli.scenario import flags_of_config, option_keys, scenario_options
from lbbench.experiment import RunConfig
from lbbench.rundir import config_record


def invoke(*args):
    return CliRunner().invoke(main, ["run", *map(str, args)], catch_exceptions=False)


def frame(run_dir, name="requests.parquet"):
    return pl.read_parquet(run_dir / name)


SMALL = ["--router", "round_robin,jsq", "--requests", "150", "--seeds", "2", "--rate", "15",
         "--slo", "ttft=2,e2e=30", "--decisions"]


def test_from_repeats_a_simulated_run_record_for_record(tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    res = invoke(*SMALL, "--out", first)
    assert res.exit_code == 0, res.output
    res = invoke("--from", first, "--out", again)
    assert res.exit_code == 0, res.output
    a, b = frame(first), frame(again)
    assert a.height == b.height == 2 * 2 * 150
    # the simulator records no wall-clock time (no send times: those are a live run's); the one column that
    # differs is the run's own id, a fresh uuid per run
    assert a["actual_send_s"].null_count() == a.height and a["planned_send_s"].null_count() == a.height
    assert a["run_id"].n_unique() == 1 and a["run_id"][0] != b["run_id"][0]
    assert_frame_equal(a.drop("run_id"), b.drop("run_id"), check_exact=True)
    for name in ("timeline.parquet", "decisions.parquet"):
        assert_frame_equal(frame(first, name).drop("run_id", strict=False),
                           frame(again, name).drop("run_id", strict=False), check_exact=True)
    assert_frame_equal(frame(first, "summary.parquet"), frame(again, "summary.parquet"), check_exact=True)
    recorded = [tomllib.loads((d / "run.toml").read_text())["config"] for d in (first, again)]
    assert recorded[0] == recorded[1]


def test_flags_after_from_override_what_was_recorded(tmp_path):
    assert invoke(*SMALL, "--out", tmp_path / "first").exit_code == 0
    res = invoke("--from", tmp_path / "first", "--router", "jsq", "--seeds", "1", "--out", tmp_path / "one")
    assert res.exit_code == 0, res.output
    df = frame(tmp_path / "one")
    assert df["router"].unique().to_list() == ["jsq"] and df["seed"].unique().to_list() == [0]
    jsq0 = frame(tmp_path / "first").filter((pl.col("router") == "jsq") & (pl.col("seed") == 0))
    assert_frame_equal(jsq0.drop("run_id"), df.drop("run_id"))  # the rest as recorded: same arrivals, same SLO


BENCH = """
# what the nightly job replays (keys: lbbench run's options without the dashes)
profile = "llama2-7b-v100"
instances = 4
workload = "paper-mix"
rate = 15
requests = 150
router = ["round_robin", "jsq"]
seeds = [0, 1]
slo = {ttft = 2, e2e = 30}
decisions = true
"""


def test_a_scenario_file_runs_what_its_flags_would(tmp_path):
    (tmp_path / "bench.toml").write_text(BENCH)
    assert invoke("--config", tmp_path / "bench.toml", "--out", tmp_path / "file").exit_code == 0
    assert invoke(*SMALL, "--out", tmp_path / "flags").exit_code == 0
    assert_frame_equal(frame(tmp_path / "file").drop("run_id"), frame(tmp_path / "flags").drop("run_id"))
    # a flag overrides the file; a repeatable flag's array, the comma form and a KEY=VALUE table are all read
    (tmp_path / "more.toml").write_text(
        BENCH.replace('router = ["round_robin", "jsq"]', 'router = "round_robin,late_binding_srpt"') +
        "router_opt = {late_binding_srpt = {max_wait_s = 30}}\n")
    res = invoke("--config", tmp_path / "more.toml", "--seeds", "1", "--requests", "60", "--out", tmp_path / "o")
    assert res.exit_code == 0, res.output
    doc = tomllib.loads((tmp_path / "o" / "run.toml").read_text())["config"]
    assert doc["routers"] == ["round_robin", "late_binding_srpt"] and doc["seeds"] == 1 and doc["requests"] == 60
    assert doc["router_options"]["late_binding_srpt"]["max_wait_s"] == 30


@pytest.mark.parametrize("text,line", [
    ("routers = ['jsq']", "bench.toml: unknown key 'routers' (did you mean 'router'?)"),
    ("instance_schedulr = 'fcfs'", "bench.toml: unknown key 'instance_schedulr' (did you mean 'instance_scheduler'?)"),
    ("seeds = 'five'", "bench.toml: seeds: expected an integer, got a string ('five')"),
    ("burstiness = 'high'", "bench.toml: burstiness: expected a number, got a string ('high')"),
    ("decisions = 'yes'", "bench.toml: decisions: expected true or false, got a string ('yes')"),
    ("chunked-prefill = 'maybe'", "bench.toml: chunked-prefill: 'maybe' is not one of 'profile', 'on', 'off', 'both'."),
    ("seeds = 0", "bench.toml: seeds: 0 is not in the range x>=1."),
    ("seeds = [0, 2]", "bench.toml: seeds: an array of seeds must be consecutive integers"),
    ("profile = {name = 'x'}",
     "bench.toml: profile: expected a string (or an array: the flag's comma form), got a table"),
    ("rate = -3", "bench.toml: rate: '-3' must be > 0 requests/s"),
    ("router = 'round_robin'\nrouter = 'jsq'", "bench.toml: not valid TOML"),
])
def test_a_bad_scenario_file_is_one_line_naming_the_key(tmp_path, text, line):
    (tmp_path / "bench.toml").write_text(text + "\n")
    res = CliRunner().invoke(main, ["run", "--config", str(tmp_path / "bench.toml"), "--requests", "5",
                                    "--out", str(tmp_path / "x")])
    assert res.exit_code == 2, res.output
    (got,) = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert got.startswith(f"Error: {tmp_path}/") and line in got, got


def test_the_example_scenario_is_the_documented_nightly_run():
    from pathlib import Path

    from lbbench.cli.scenario import read_scenario

    example = Path(__file__).resolve().parents[1] / "examples" / "bench.toml"
    values = read_scenario(example, click.Context(run_cmd))
    assert values["routers"] == "round_robin,jsq,min_min,mcu" and (values["seed"], values["seeds"]) == (0, 5)
    assert values["slo"] == "ttft=90,e2e=180" and values["rate"] == "20"


def test_every_option_of_run_is_a_key_and_a_new_one_is_too():
    keys = option_keys(run_cmd)
    options = [p for p in run_cmd.params if isinstance(p, click.Option)]
    assert len(keys) == len(options) - 2 >= 63  # every option but --config and --from themselves
    assert {"router", "rate", "seeds", "instance_scheduler", "router_opt", "slo", "out", "format", "wide",
            "trace_format", "no_saturation_stop", "endpoint", "endpoints"} <= set(keys)

    @click.command()
    @scenario_options(lambda kw: None)
    @click.option("--brand-new-flag", type=int, default=1)
    def cmd(**kw):
        click.echo(kw["brand_new_flag"])

    assert set(option_keys(cmd)) == {"brand_new_flag"}


# ------------------------------------------------------------------ every recorded field round-trips as flags
CASES = {
    "defaults": [],
    "sim": ["--fleet", "llama3.1-8b-a100-v0:2,llama3.1-8b-l4-v0:2", "--workload", "poisson", "--rate", "5,10",
            "--requests", "50", "--jobs", "2", "--slo", "ttft=2,tbt=0.1", "--router", "round_robin,jsq,wgrl",
            "--instance-scheduler", "fcfs,priority", "--chunked-prefill", "both", "--prefix-caching", "on",
            "--seeds", "3", "--seed", "7", "--burstiness", "2.5", "--prompt-tokens", "256:0.5",
            "--output-tokens", "64", "--predictor", "noisy:0.8", "--router-opt", "jsq.tie_break=true",
            "--timeline-interval", "0", "--counterfactual", "2", "--counterfactual-every", "3",
            "--saturation-threshold", "3", "--saturation-window", "10", "--ray",
            "--admission", "max_queue=8,fairness=fcfs", "--tenants", "gold:1@1,std@3", "--signal-lag-s", "0.5"],
    "classes": ["--workload", "paper-classes", "--order", "lh_then_hl,all_random", "--chunked-prefill", "on",
                "--router", "wgrl", "--checkpoint", "ckpt/", "--kv-link", "pcie4"],
    "trace": ["--trace", "t.csv", "--trace-format", "mapped", "--mapping", "arrival=a,prompt=p,output=o",
              "--skip-bad-rows", "--time-scale", "2", "--window", "10:", "--max-prompt-tokens", "1000",
              "--prompt-overflow", "truncate"],
    "attach": ["--endpoint", "http://a:1@llama2-7b-v100", "--endpoint", "http://b:2", "--model", "m",
               "--kv-events", "tcp://a:5557", "--kv-events", "tcp://b:5557",
               "--api", "chat", "--engine", "sglang", "--prompt-mode", "text", "--tokenizer", "tok",
               "--request-timeout", "30", "--load-workers", "2", "--send-lead", "0.05", "--on-saturation",
               "cancel", "--no-saturation-stop"],
    "launch": ["--launch", "tiny", "--instances", "2",
               "--launch-args", "1:--no-enable-chunked-prefill --max-num-seqs 8",
               "--vllm-python", "/opt/vllm/bin/python", "--cpus-per-instance", "2", "--api-server-cores", "instance",
               "--stream-workers", "2", "--chunked-prefill", "off"],
}


def _recorded(args: list[str]) -> dict:
    ctx = run_cmd.make_context("run", list(args))
    doc = config_record(config_from_flags(dict(ctx.params)).resolved())
    return tomllib.loads(tomli_w.dumps(doc))  # as run.toml holds it


def _repeated(recorded: dict) -> dict:
    ctx = click.Context(run_cmd)
    flags = flags_of_config(recorded)
    kw = {p.name: p.process_value(ctx, flags.get(p.name, p.default)) for p in run_cmd.params}
    return tomllib.loads(tomli_w.dumps(config_record(config_from_flags(kw).resolved())))


@pytest.mark.parametrize("name", list(CASES))
def test_recorded_config_round_trips_through_the_flags(name):
    recorded = _recorded(CASES[name])
    assert _repeated(recorded) == recorded


def test_the_cases_set_every_field_of_the_config():
    """Each RunConfig field takes a non-default value in some case above: a field added without a way back from
    run.toml to the flags fails here (and ``--from`` would refuse it by name)."""
    default = _recorded([])
    moved = {k for rec in map(_recorded, CASES.values()) for k in {*rec, *default} if default.get(k) != rec.get(k)}
    assert moved | {"backend"} == {f.name for f in dataclasses.fields(RunConfig)}


def test_from_refuses_by_name_what_the_flags_cannot_repeat(tmp_path):
    assert invoke("--router", "jsq", "--requests", "20", "--out", tmp_path / "r").exit_code == 0
    path = tmp_path / "r" / "run.toml"
    doc = tomllib.loads(path.read_text())
    doc["config"]["chunked_prefill"] = [True, False]  # no --chunked-prefill value gives this order
    path.write_text(tomli_w.dumps(doc))
    res = CliRunner().invoke(main, ["run", "--from", str(tmp_path / "r"), "--out", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert "run.toml records chunked_prefill = [True, False], which the flags of this lbbench run cannot " \
           "repeat" in res.stderr
    doc["config"]["chunked_prefill"] = ["default"]
    doc["config"]["warp_drive"] = True  # a setting this version has no flag for
    path.write_text(tomli_w.dumps(doc))
    res = CliRunner().invoke(main, ["run", "--from", str(tmp_path / "r"), "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "run.toml records warp_drive: this version of lbbench run has no flag" in res.stderr
    del doc["config"]["warp_drive"]
    path.write_text(tomli_w.dumps(doc))
    for bad, says in ((tmp_path, "not a run directory (no run.toml)"),
                      (tmp_path / "r", "that is the run --from repeats")):
        res = CliRunner().invoke(main, ["run", "--from", str(bad), "--out", str(tmp_path / "r")])
        assert res.exit_code == 2 and says in res.stderr, res.stderr


def test_from_warns_when_the_profile_changed_since(tmp_path):
    assert invoke("--router", "jsq", "--requests", "20", "--out", tmp_path / "r").exit_code == 0
    path = tmp_path / "r" / "run.toml"
    doc = tomllib.loads(path.read_text())
    doc["profile"]["max_num_seqs"] = doc["profile"]["max_num_seqs"] + 1
    path.write_text(tomli_w.dumps(doc))
    res = invoke("--from", tmp_path / "r", "--out", tmp_path / "again")
    assert res.exit_code == 0
    assert "warning: profile llama2-7b-v100 differs from the one" in res.stderr and "max_num_seqs" in res.stderr
