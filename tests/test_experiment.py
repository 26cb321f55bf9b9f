"""The one experiment runner: typed config, plan, sim and live backends through the same code, run directory."""

from __future__ import annotations

import contextlib
import pickle
import threading
import tomllib

import polars as pl
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.cli import main
from lbbench.cli.flags import FLAGS, user_message
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
from lbbench.distributed import SerialExecutor
from lbbench.experiment import ConfigError, Reporter, RunConfig, plan, run_experiment, simulate, works
from lbbench.experiment.backends import LiveBackend, SimBackend, SimFleet
from lbbench.rundir import RECORD_SCHEMA, TIMELINE_SCHEMA, read_run_toml
from lbbench.experiment.runner import run_units
from lbbench.experiment.units import UnitResult, run_unit
from lbbench.profiles import load_profile

V100 = load_profile("llama2-7b-v100")


# ------------------------------------------------------------------------------------------ config


def test_resolved_fills_the_defaults_that_depend_on_other_fields():
    cfg = RunConfig(workload="paper-classes", requests=None, routers=["round_robin", "wgrl"]).resolved()
    assert cfg.requests == 3000
    assert cfg.orders == ["lh_hl_random", "all_random", "lh_then_hl", "hl_then_lh"]
    assert cfg.router_options == {"wgrl": {"workload": "paper-classes"}}
    live = RunConfig(endpoints=["http://a:1", "http://b:2", "http://c:3"], instances=4, rates=[7.0]).resolved()
    assert (live.instances, live.backend, live.rate_per_s, live.rates) == (3, "live", 7.0, [])
    assert RunConfig(rates=[1.0, 2.0]).resolved().rate_per_s is None


@given(workload=st.sampled_from(["paper-mix", "paper-classes", "poisson"]),
       requests=st.one_of(st.none(), st.integers(1, 5000)),
       rates=st.lists(st.floats(0.1, 100), max_size=3),
       endpoints=st.lists(st.just("http://h:1"), max_size=3))
@settings(max_examples=60, deadline=None)
def test_resolved_is_idempotent(workload, requests, rates, endpoints):
    cfg = RunConfig(workload=workload, requests=requests, rates=rates, endpoints=endpoints).resolved()
    assert cfg.resolved() == cfg


@pytest.mark.parametrize("cfg, field", [
    (RunConfig(routers=[]), "routers"),
    (RunConfig(instance_schedulers=["lifo"]), "instance_schedulers"),
    (RunConfig(orders=["all_random"]), "orders"),
    (RunConfig(trace="no/such/trace.csv"), "trace"),
    (RunConfig(rate_per_s=-1.0), "rate_per_s"),
    (RunConfig(router_options={"jsq": {"x": 1}}), "router_options"),
    (RunConfig(endpoints=["http://a:1"], launch_model="tiny"), "launch_model"),
    (RunConfig(engine="sglang"), "engine"),
    (RunConfig(launch_model="tiny", instance_schedulers=["fcfs", "priority"]), "instance_schedulers"),
    (RunConfig(endpoints=["http://a:1"], chunked_prefill=[True]), "chunked_prefill"),
    (RunConfig(api="grpc"), "api"),
])
def test_check_names_the_field_and_never_a_flag(cfg, field):
    with pytest.raises(ConfigError) as info:
        cfg.resolved().check(V100)
    assert info.value.field == field
    assert "--" not in str(info.value)
    assert str(info.value).startswith(f"{field}: ")
    # the CLI maps the field back to the flag a user typed
    assert user_message(info.value).startswith(FLAGS[field])


def test_user_message_maps_a_leading_field_and_leaves_other_text():
    assert user_message(ValueError("rate_per_s: -1 must be > 0")) == "--rate: -1 must be > 0"
    assert user_message(ValueError("endpoint http://x:1: unreachable")) == "--endpoint http://x:1: unreachable"
    assert user_message(ValueError("/tmp/t.csv: row 3: bad\nmore")) == "/tmp/t.csv: row 3: bad"
    assert user_message(ValueError("something else: x")) == "something else: x"


def test_the_cli_reports_a_config_error_with_the_flag(tmp_path):
    res = CliRunner().invoke(main, ["run", "--rate", "5", "--instance-scheduler", "lifo", "--out", str(tmp_path)])
    assert res.exit_code == 2
    assert res.output.startswith("Error: --instance-scheduler: unknown 'lifo'")


# ------------------------------------------------------------------------------------------ plan


def test_plan_is_variants_times_seeds_times_routers_with_unique_labels():
    cfg = RunConfig(workload="paper-classes", routers=["round_robin", "jsq"], seeds=3,
                    instance_schedulers=["fcfs", "priority"], chunked_prefill=[False, True]).resolved()
    units = plan(cfg)
    assert len(units) == 4 * 2 * 2 * 3 * 2
    assert len({u.label for u in units}) == len(units)
    # paired seeds: every router appears once per (variant, seed)
    seen = {(u.variant, u.seed, u.router) for u in units}
    assert len(seen) == len(units)


class _CountingFleet:
    """A fleet of our own under the one unit body: it records what the body asks of it."""

    def __init__(self, log):
        self.log = log
        self.num_instances = 2

    def prepare(self, requests):
        self.log.append(("prepare", len(requests), requests))

    def run(self, work, requests, router, reporter):
        from lbbench.core import RequestRecord
        self.log.append(("run", work.label, router.name))
        recs = [RequestRecord.for_request(r, run_id="x", router=work.unit.router, seed=work.unit.seed, instance=0,
                                          dispatch_s=r.arrival_s, first_token_s=r.arrival_s + 0.1,
                                          finish_s=r.arrival_s + 1.0, generated_tokens=r.output_tokens)
                for r in requests]
        return UnitResult(recs, [(0.0, 0, 1, 0, 0.5, 0)], work.unit.router != "jsq")


class _CountingLiveBackend(LiveBackend):
    """The live backend's own unit walk, on counting fleets in place of servers."""

    def __init__(self, cfg, log):
        super().__init__(cfg, V100, None, Reporter())
        self.log = log

    @contextlib.contextmanager
    def fleet(self, variant):
        self.log.append(("open", variant.chunked_prefill))
        yield _CountingFleet(self.log)
        self.log.append(("close", variant.chunked_prefill))


def test_a_live_run_opens_one_fleet_per_variant_and_stops_after_an_incomplete_unit():
    cfg = RunConfig(routers=["round_robin", "least_requests"], seeds=2, requests=20, rate_per_s=5.0,
                    chunked_prefill=[False, True]).resolved()
    log, added = [], []
    backend = _CountingLiveBackend(cfg, log)
    assert run_units(works(cfg, V100, "r"), backend.run, backend.executor(None),
                     lambda work, out: added.append((work.label, out)), Reporter())
    backend.close()
    assert [e for e in log if e[0] in ("open", "close")] == [("open", False), ("close", False), ("open", True),
                                                             ("close", True)]
    assert [label for label, _ in added] == [u.label for u in plan(cfg)]
    # paired: every router of a seed is handed the very same requests, another seed other ones
    prepared = [e[2] for e in log if e[0] == "prepare"]
    assert len(prepared) == 8 and prepared[0] is prepared[1] and prepared[1] is not prepared[2]
    # a unit that did not complete ends the walk: it is kept, nothing after it runs
    cfg = RunConfig(routers=["round_robin", "jsq", "least_requests"], seeds=2, requests=20, rate_per_s=5.0).resolved()
    log, added = [], []
    backend = _CountingLiveBackend(cfg, log)
    assert not run_units(works(cfg, V100, "r"), backend.run, SerialExecutor(),
                         lambda work, out: added.append((work.label, out)), Reporter())
    backend.close()
    assert [e[1] for e in log if e[0] == "run"] == ["round_robin-seed0", "jsq-seed0"]
    label, out = added[-1]
    assert label == "jsq-seed0" and not out.complete and out.records.height == 20
    assert out.records["router"].unique().to_list() == ["jsq"]
    assert out.timeline.columns[:7] == list(TIMELINE_SCHEMA) and out.timeline["router"].to_list() == ["jsq"]
    assert log[-1] == ("close", None)


def test_the_unit_body_builds_the_frames_with_the_run_columns_and_the_units_progress():
    cfg = RunConfig(requests=30, rate_per_s=5.0, routers=["round_robin"], rates=[5.0, 7.0]).resolved()
    events = []

    class Events(Reporter):
        def unit_started(self, label, total):
            events.append(("started", label, total))

        def unit_progress(self, label, done, total):
            events.append(("progress", label, total))

    work = works(cfg, V100, "r")[1]
    out = run_unit(work, SimFleet(work.instance_profiles()), Events())
    assert out.complete and out.notes == [] and out.records.height == 30
    assert out.records["rate_per_s"].unique().to_list() == [7.0]
    assert out.timeline["rate_per_s"].unique().to_list() == [7.0]
    assert events[0] == ("started", "round_robin-seed0-rate7", 30)
    assert events[-1] == ("progress", "round_robin-seed0-rate7", 30)


# ------------------------------------------------------------------------------------------ sim and live


def _run(cfg, out):
    return run_experiment(cfg, out, reporter=Reporter())


def test_sim_and_live_write_the_same_run_directory(tmp_path):
    """One runner: a simulated run and a live run (against emulated vLLM servers) give the same files, the
    same columns and the same router labels; the live timeline is the scraped one, in the same file."""
    common = dict(profile="llama3.1-8b-a100-v0", workload="poisson", rate_per_s=20.0, requests=40,
                  routers=["round_robin", "least_requests"], prompt_tokens="64", output_tokens="8",
                  timeline_interval_s=0.2)
    sim = _run(RunConfig(instances=2, **common), tmp_path / "sim")
    with EmulatorFleet(FleetConfig(load_profile("llama3.1-8b-a100-v0"), 2)) as fleet:
        live = _run(RunConfig(endpoints=fleet.endpoints, **common), tmp_path / "live")
    assert sim.complete and live.complete
    for out in (sim.path, live.path):
        assert sorted(p.name for p in out.iterdir() if p.is_file()) == [
            "requests.parquet", "run.toml", "summary.parquet", "timeline.parquet"]
    s, lv = (pl.read_parquet(o.path / "requests.parquet") for o in (sim, live))
    assert s.columns == lv.columns and list(RECORD_SCHEMA) == s.columns[:len(RECORD_SCHEMA)]
    assert s["router"].unique(maintain_order=True).to_list() == lv["router"].unique(maintain_order=True).to_list()
    assert (s["backend"].unique().to_list(), lv["backend"].unique().to_list()) == (["sim"], ["live"])
    assert lv["error"].null_count() == lv.height and lv.height == 80
    # paired: both backends replayed the very same requests
    key = ["router", "request_id", "prompt_tokens", "output_tokens"]
    assert s.select(key).sort(key[:2]).equals(lv.select(key).sort(key[:2]))
    ts, tl = (pl.read_parquet(o.path / "timeline.parquet") for o in (sim, live))
    assert ts.columns == tl.columns
    assert tl.height > 0 and set(tl["router"].unique()) == {"round_robin", "least_requests"}
    toml = read_run_toml(live.path)
    assert toml["complete"] is True and toml["config"]["backend"] == "live"
    assert toml["config"]["endpoints"] == fleet.endpoints
    # every live record was also appended as it completed
    partial = sorted(p.parent.name for p in (live.path / "partial").rglob("requests.partial.jsonl"))
    assert partial == ["least_requests-seed0", "round_robin-seed0"]


class _Loud(Reporter):
    """A reporter that cannot be pickled (as the CLI's, which draws on this terminal)."""

    def __init__(self):
        self.lock = threading.Lock()


def test_a_simulated_run_is_deterministic_and_a_backend_sent_to_a_worker_reports_to_nobody():
    cfg = RunConfig(requests=60, rate_per_s=10.0, routers=["jsq"]).resolved()
    a, b = simulate(cfg, V100, "r"), simulate(cfg, V100, "r")
    assert len(a) == 1 and a[0].records.equals(b[0].records) and a[0].timeline.equals(b[0].timeline)
    sent = pickle.loads(pickle.dumps(SimBackend(_Loud(), jobs=3)))
    assert type(sent.reporter) is Reporter and sent.jobs == 3


def test_an_interrupted_run_keeps_what_it_measured(tmp_path, monkeypatch):
    from lbbench.experiment import backends

    real = backends.SimFleet.run
    calls = []

    def run(self, work, requests, router, reporter):
        calls.append(work.unit.router)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, work, requests, router, reporter)

    monkeypatch.setattr(backends.SimFleet, "run", run)
    out = _run(RunConfig(requests=30, rate_per_s=5.0, routers=["round_robin", "jsq"]), tmp_path)
    assert not out.complete
    toml = tomllib.loads((tmp_path / "run.toml").read_text())
    assert toml["complete"] is False and toml["runs_completed"] == 1
    assert pl.read_parquet(tmp_path / "requests.parquet")["router"].unique().to_list() == ["round_robin"]
