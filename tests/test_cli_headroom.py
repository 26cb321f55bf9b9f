"""`lbbench headroom` end to end, and the oracle planner's labels and refusals through the CLI."""

import json

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.experiment.headroom import CLASSICAL

TINY = ("--instances", "2", "--requests", "30", "--rate", "4", "--seeds", "2", "--tuning-seeds", "1",
        "--router-opt", "lookahead.horizon_s=1")


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def headroom_json(tmp_path_factory):
    out = tmp_path_factory.mktemp("headroom")
    res = invoke("headroom", *TINY, "--router", "jsq,mcu", "--format", "json", "--out", str(out))
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), out


def test_headroom_rows_roles_and_shares(headroom_json):
    doc, out = headroom_json
    rows = {r["role"].split(" (")[0]: r for r in doc["rows"]}
    assert doc["complete"] and doc["tuning_seeds"] == [1000]
    assert doc["best_heuristic"] in CLASSICAL
    assert {"round robin", "random", "best classical heuristic", "strongest router x instance scheduler",
            "planner", "planner, reordering"} <= set(rows)
    assert [r["router"] for r in doc["rows"] if r["role"] == "asked"] == [
        r for r in ("jsq", "mcu") if r != doc["best_heuristic"]]
    rr = rows["round robin"]["mean_e2e_s"]
    plan = rows["planner"]["mean_e2e_s"]
    for r in doc["rows"]:
        assert r["deployable"] == (not r["router"].startswith("lookahead"))
        assert r["seeds"] == 2
        assert r["improvement_vs_round_robin_pct"] == pytest.approx(100 * (rr - r["mean_e2e_s"]) / rr)
        if rr > plan:
            assert r["headroom_captured"] == pytest.approx((rr - r["mean_e2e_s"]) / (rr - plan))
        else:  # no headroom found: the share is undefined
            assert r["headroom_captured"] is None
        rr_t, plan_t = rows["round robin"]["mean_ttft_s"], rows["planner"]["mean_ttft_s"]
        if rr_t > plan_t:
            assert r["headroom_captured_ttft"] == pytest.approx((rr_t - r["mean_ttft_s"]) / (rr_t - plan_t))
        else:
            assert r["headroom_captured_ttft"] is None
    # every part is an ordinary run directory; the evaluation never ran on the tuning seeds
    for part in ("tuning", "baselines", "routers", "planner", "planner-reorder"):
        assert (out / part / "requests.parquet").is_file(), part
    assert set(pl.read_parquet(out / "tuning" / "requests.parquet")["seed"].unique()) == {1000}
    assert set(pl.read_parquet(out / "planner" / "requests.parquet")["seed"].unique()) == {0, 1}
    assert pl.read_parquet(out / "headroom.parquet").height == len(doc["rows"])


def test_headroom_with_prefix_caching_reports_ttft(tmp_path):
    res = invoke("headroom", "--profile", "llama3.1-8b-a100", "--instances", "2", "--workload", "agentic",
                 "--prefix-caching", "on", "--requests", "40", "--rate", "10", "--seeds", "1", "--tuning-seeds", "1",
                 "--no-reorder", "--router", "online_ttft", "--router-opt", "lookahead.horizon_s=1",
                 "--router-opt", "lookahead.base=precise_prefix", "--format", "json", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert {r["router"] for r in rows} >= {"round_robin", "online_ttft", "lookahead"}
    assert all(r["mean_ttft_s"] > 0 for r in rows)
    hits = pl.read_parquet(tmp_path / "routers" / "requests.parquet")["cached_prompt_tokens"].sum()
    assert hits > 0  # prefix caching reached the parts


def test_headroom_html_and_table_label_the_planner_an_oracle(tmp_path):
    out = tmp_path / "h"
    res = invoke("headroom", *TINY, "--no-reorder", "--seeds", "1", "--format", "html", "--out", str(out))
    assert res.exit_code == 0, res.output
    page = (out / "headroom.html").read_text()
    assert "lookahead (oracle)" in page and "not deployable" in page and "lookahead+reorder" not in page


def test_headroom_refuses_the_planner_as_an_asked_router(tmp_path):
    res = CliRunner().invoke(main, ["headroom", *TINY, "--router", "lookahead", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "always part of headroom" in res.output


def test_live_run_refuses_the_oracle_with_one_line():
    res = CliRunner().invoke(main, ["run", "--endpoint", "http://127.0.0.1:9", "--router", "round_robin,lookahead",
                                    "--requests", "5"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines == ["Error: --router: lookahead is an oracle: it reads true lengths and future arrivals, and "
                     "runs only on the simulator"]


def test_routers_lists_the_planner_as_not_deployable():
    res = invoke("routers", "--format", "json")
    desc = {r["name"]: r["description"] for r in json.loads(res.stdout)}
    assert "not deployable: sees true lengths and future arrivals" in desc["lookahead"]


def test_run_with_the_planner_says_it_is_an_oracle(tmp_path):
    res = invoke("run", "--router", "round_robin,lookahead", "--router-opt", "lookahead.horizon_s=1",
                 "--instances", "2", "--requests", "20", "--rate", "4", "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    assert "lookahead is an oracle" in res.output
