"""Decision traces: ``lbbench run --decisions`` / ``--counterfactual K`` and the recorder behind them."""

from __future__ import annotations

import math

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.core import Decision
from lbbench.experiment.decisions import DECISION_SCHEMA, DecisionRecorder, counterfactual_cost
from lbbench.reports.report import build_report
from lbbench.routers import get_router
from lbbench.routers.lookahead import LookaheadParams, evaluate
from lbbench.sim.cluster import ClusterSim
from tests.factories import req, tiny_profile

SMALL = ["run", "--requests", "40", "--rate", "20", "--timeline-interval", "0"]


def _reqs():
    return [req(i, 0.02 * i, 10 + (7 * i) % 23, 30 - (5 * i) % 17) for i in range(10)]


@pytest.mark.parametrize("router", ["least_requests", "round_robin", "kv_overlap", "least_work_speed"])
def test_the_cli_writes_decisions_with_the_documented_schema(tmp_path, router):
    res = CliRunner().invoke(main, [*SMALL, "--router", router, "--decisions", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(tmp_path / "decisions.parquet")
    for col, dtype in DECISION_SCHEMA.items():
        assert df.schema[col] == dtype, col
    assert df["router"].unique().to_list() == [router] and df.schema["seed"] == pl.Int64
    dispatched = df.filter(pl.col("chosen_instance").is_not_null())
    assert dispatched.height == 40 and sorted(dispatched["chosen_request_id"]) == list(range(40))
    assert all(len(x) == 4 for x in df["outstanding"])
    assert df["regret_s"].null_count() == df.height  # no counterfactuals asked
    has_scores = router != "round_robin"
    assert (df["scores"].null_count() == 0) is has_scores
    if has_scores:  # the chosen instance is among the lowest scores
        for s, c in zip(df["scores"], df["chosen_instance"]):
            if c is not None:
                assert s[c] == min(s)


def test_no_decisions_file_without_the_flag(tmp_path):
    assert CliRunner().invoke(main, [*SMALL, "--out", str(tmp_path)]).exit_code == 0
    assert not (tmp_path / "decisions.parquet").exists()


def test_counterfactuals_through_the_cli_give_non_negative_regret(tmp_path):
    res = CliRunner().invoke(main, [*SMALL, "--router", "least_requests", "--counterfactual", "2",
                                    "--counterfactual-every", "3", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    df = pl.read_parquet(tmp_path / "decisions.parquet")
    cf = df.filter(pl.col("regret_s").is_not_null())
    assert cf.height == df.filter(pl.col("decision") % 3 == 0).height > 0
    assert (cf["regret_s"] >= 0).all()
    assert all(len(x) == 3 for x in cf["cf_instances"])  # the chosen one and the 2 best others
    assert (cf["chosen_cost_s"] == cf["cf_costs"].list.first()).all()


@pytest.mark.parametrize("horizon_s", [math.inf, 0.3])
def test_counterfactual_cost_is_the_planners_rollout(horizon_s):
    profile = tiny_profile(num_kv_blocks=24)
    sim = ClusterSim(profile, 3, _reqs())
    sim.advance(0.05)
    assert sim.queue
    params = LookaheadParams(base="jsq", horizon_s=horizon_s)
    for action in [None] + [Decision(0, i) for i in range(3)]:
        ours = counterfactual_cost(sim, action, lambda: get_router("jsq", num_instances=3, profile=profile), (),
                                   horizon_s)
        assert ours == pytest.approx(evaluate(sim, action, params=params), abs=1e-9)


def test_k_all_records_the_planners_exact_cost_of_every_instance_at_every_decision():
    profile = tiny_profile(num_kv_blocks=24)
    sim = ClusterSim(profile, 3, _reqs())
    make = lambda: get_router("jsq", num_instances=3, profile=profile)  # noqa: E731
    rec = DecisionRecorder(make(), counterfactual=10, horizon_s=math.inf, factory=make)
    checked = []

    class Check:  # compares each recorded decision with the planner's own evaluation at that very epoch
        name = "jsq"

        def bind_simulator(self, s):
            rec.bind_simulator(s)

        def route(self, queue, view, now_s):
            pending = list(sim.dispatcher.decided)
            d = rec.route(queue, view, now_s)
            insts, costs = rec._cf[len(checked)]
            want = [evaluate(sim, None if i == -1 else Decision(d.queue_index if d else 0, i), pending=pending,
                             params=LookaheadParams(base="jsq", horizon_s=math.inf)) for i in insts]
            assert sorted(insts) == ([-1, 0, 1, 2] if d is None else [0, 1, 2])
            assert costs == pytest.approx(want, abs=1e-9)
            checked.append(d)
            return d

    sim.run(Check())
    assert len(checked) >= 10
    df = rec.frame({})
    assert df.height == len(checked) and df["regret_s"].null_count() == 0 and (df["regret_s"] >= 0).all()
    assert (df["regret_s"] == df["chosen_cost_s"] - df["cf_costs"].list.min()).all()


@pytest.mark.parametrize("extra, says", [
    (["--counterfactual", "0"], "--counterfactual: 0: must be >= 1"),
    (["--counterfactual", "-2"], "--counterfactual: -2: must be >= 1"),
    (["--counterfactual", "2", "--endpoint", "http://127.0.0.1:9"], "--counterfactual: needs simulator forks"),
    (["--counterfactual", "2", "--launch", "tiny"], "--counterfactual: needs simulator forks"),
])
def test_bad_counterfactual_input_is_one_line_and_exit_2(tmp_path, extra, says):
    res = CliRunner().invoke(main, [*SMALL, *extra, "--out", str(tmp_path)])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and says in lines[0], res.output


def test_the_report_has_a_decision_section_in_text_and_html(tmp_path):
    res = CliRunner().invoke(main, [*SMALL, "--router", "least_requests", "--counterfactual", "1",
                                    "--counterfactual-every", "4", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = build_report([tmp_path], num_resamples=50)
    names = [t.name for t in report.tables]
    assert names[-4:] == ["decisions", "regret_by_load", "regret_by_size", "top_regret"]
    over = report.table("decisions").df.row(0, named=True)
    assert over["decisions"] >= 40 and over["counterfactuals"] == (over["decisions"] + 3) // 4
    assert 0 <= over["frac_regret_gt_0_1s"] <= 1
    top = report.table("top_regret").df
    assert top.height == min(10, over["counterfactuals"]) and top["regret_s"].is_sorted(descending=True)
    assert "Regret by load" in report.render("table") and "Regret by request size" in report.render("html", plots=False)


def test_a_report_without_decisions_has_no_decision_section(tmp_path):
    assert CliRunner().invoke(main, [*SMALL, "--out", str(tmp_path)]).exit_code == 0
    assert report_has_no_decisions(tmp_path)


def report_has_no_decisions(path):
    return not {"decisions", "top_regret"} & {t.name for t in build_report([path], num_resamples=50).tables}
