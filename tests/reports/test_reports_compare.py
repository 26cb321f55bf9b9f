"""lbbench compare logic: pairing, warnings, regression verdicts (synthetic and simulated runs)."""

from __future__ import annotations

import polars as pl
import pytest

from lbbench.profiles import load_profile
from lbbench.reports.compare import CompareError, compare_runs, parse_pairs, parse_threshold
from lbbench.reports.compare_render import render_comparison
from lbbench.reports.synthetic import synthetic_requests, write_run
from lbbench.routers import get_router
from lbbench.sim.cluster import ClusterSim
from lbbench.workloads.paper_mix import paper_mix


def test_parse_threshold_and_pairs():
    assert parse_threshold("3%") == 3.0 and parse_threshold(" 2.5 ") == 2.5
    with pytest.raises(CompareError, match="^max_regression"):
        parse_threshold("lots")
    assert parse_pairs(["jsq=random"]) == [("jsq", "random")]
    with pytest.raises(CompareError, match="^pair"):
        parse_pairs(["jsq"])


def test_identical_runs_no_regression(tmp_path):
    df = synthetic_requests(num_requests=80, seeds=(0, 1))
    write_run(tmp_path / "a", df)
    write_run(tmp_path / "b", df)
    cmp = compare_runs(tmp_path / "a", tmp_path / "b", num_resamples=200)
    assert not cmp.regressed
    assert {r.baseline_router for r in cmp.rows} == {"round_robin", "jsq", "random"}
    assert all(r.change.change_pct == 0 and r.change.paired for r in cmp.rows)


def test_slower_candidate_regresses_and_warns_on_settings(tmp_path):
    write_run(tmp_path / "a", synthetic_requests(routers=("jsq",), num_requests=150, seeds=(0, 1)))
    write_run(tmp_path / "b", synthetic_requests(routers=("jsq",), num_requests=150, seeds=(0, 1),
                                                 slowdown={"jsq": 1.3}, profile="other"))
    cmp = compare_runs(tmp_path / "a", tmp_path / "b", metrics=["mean_e2e_s", "throughput_tokens_per_s"],
                       num_resamples=200)
    assert cmp.regressed
    e2e = next(r for r in cmp.rows if r.metric == "mean_e2e_s")
    assert e2e.verdict == "REGRESSION" and e2e.worse_pct > 20
    tput = next(r for r in cmp.rows if r.metric == "throughput_tokens_per_s")
    assert tput.change.change_pct < 0 and tput.worse_pct > 0  # higher is better
    assert any("profile differs" in w for w in cmp.warnings)
    text = render_comparison(cmp, "table")
    assert "REGRESSION" in text and "warning: setting profile differs" in text
    doc = render_comparison(cmp, "json")
    assert doc["regressed"] is True and doc["rows"][0]["metric"] == "mean_e2e_s"


def test_threshold_guards_small_changes(tmp_path):
    write_run(tmp_path / "a", synthetic_requests(routers=("jsq",), num_requests=150, seeds=(0,)))
    write_run(tmp_path / "b", synthetic_requests(routers=("jsq",), num_requests=150, seeds=(0,),
                                                 slowdown={"jsq": 0.92}))
    assert compare_runs(tmp_path / "a", tmp_path / "b", max_regression_pct=50,
                        num_resamples=200).regressed is False


def test_pairing_rules(tmp_path):
    write_run(tmp_path / "j", synthetic_requests(routers=("jsq",), num_requests=40, seeds=(0,)))
    write_run(tmp_path / "r", synthetic_requests(routers=("random",), num_requests=40, seeds=(0,)))
    cmp = compare_runs(tmp_path / "j", tmp_path / "r", num_resamples=100)  # single routers pair up
    assert [(r.baseline_router, r.candidate_router) for r in cmp.rows][0] == ("jsq", "random")
    assert any("no common router" in w for w in cmp.warnings)
    write_run(tmp_path / "both", synthetic_requests(routers=("jsq", "random"), num_requests=40,
                                                    seeds=(0,)))
    cmp = compare_runs(tmp_path / "both", tmp_path / "both", pairs=[("jsq", "random")],
                       num_resamples=100)
    assert cmp.regressed  # synthetic random is 1.25x slower than jsq on the same arrivals
    with pytest.raises(CompareError, match="^pair: router 'nope'"):
        compare_runs(tmp_path / "both", tmp_path / "both", pairs=[("nope", "jsq")])
    write_run(tmp_path / "x", synthetic_requests(routers=("round_robin", "jsq"), num_requests=20,
                                                 seeds=(0,)))
    write_run(tmp_path / "y", synthetic_requests(routers=("random", "min_min"), num_requests=20,
                                                 seeds=(0,)))
    with pytest.raises(CompareError, match="no router in both runs"):
        compare_runs(tmp_path / "x", tmp_path / "y")
    with pytest.raises(CompareError, match="^metric"):
        compare_runs(tmp_path / "j", tmp_path / "j", metrics=["speed"])


# ------------------------------------------------------------------ with the simulator

def _sim_run(path, router: str, seeds, num_requests=300, rate_per_s=13.0):
    """4 A100 instances limited to 8 running requests each, near saturation: where a
    load-blind router (random) queues requests behind busy instances and jsq does not."""
    profile = load_profile("llama3.1-8b-a100").with_overrides(max_num_seqs=8)
    frames = []
    for seed in seeds:
        reqs = paper_mix(num_requests, rate_per_s, seed)
        sim = ClusterSim(profile, 4, reqs, seed=seed)
        recs = sim.run(get_router(router, num_instances=4, seed=seed, profile=profile))
        frames.append(pl.DataFrame([r.as_dict() for r in recs], infer_schema_length=None))
    df = pl.concat(frames, how="diagonal_relaxed").with_columns(
        profile=pl.lit("llama3.1-8b-a100-seqs8"), workload=pl.lit("paper-mix"),
        num_instances=pl.lit(4), rate_per_s=pl.lit(rate_per_s), backend=pl.lit("sim"))
    return write_run(path, df)


def test_sim_random_clearly_worse_than_jsq(tmp_path):
    base = _sim_run(tmp_path / "jsq", "jsq", (0, 1, 2))
    cand = _sim_run(tmp_path / "random", "random", (0, 1, 2))
    cmp = compare_runs(base, cand, num_resamples=300)
    assert cmp.regressed
    e2e = next(r for r in cmp.rows if r.metric == "mean_e2e_s")
    assert e2e.change.paired and e2e.regression


def test_sim_same_config_other_seeds_passes(tmp_path):
    base = _sim_run(tmp_path / "a", "jsq", (0, 1, 2))
    cand = _sim_run(tmp_path / "b", "jsq", (3, 4, 5))
    cmp = compare_runs(base, cand, num_resamples=300)
    assert not cmp.regressed
    assert not cmp.rows[0].change.paired


def test_single_unpaired_seed_never_gates(tmp_path):
    write_run(tmp_path / "a", synthetic_requests(routers=("jsq",), num_requests=150, seeds=(0,)))
    write_run(tmp_path / "b", synthetic_requests(routers=("jsq",), num_requests=150, seeds=(1,),
                                                 slowdown={"jsq": 1.5}))
    cmp = compare_runs(tmp_path / "a", tmp_path / "b", num_resamples=100)
    assert not cmp.regressed
    assert all(r.verdict.startswith("not gated") for r in cmp.rows)
    assert any("single seed" in w for w in cmp.warnings)


def test_requests_without_tbt_are_left_out(tmp_path):
    df = synthetic_requests(routers=("jsq",), num_requests=60, seeds=(0,))
    df = df.with_columns(tbt_mean_s=pl.when(pl.col("request_id") % 5 == 0).then(None)
                         .otherwise(pl.col("tbt_mean_s")))
    write_run(tmp_path / "a", df)
    write_run(tmp_path / "b", df)
    cmp = compare_runs(tmp_path / "a", tmp_path / "b", metrics=["mean_tbt_s"], num_resamples=100)
    row = cmp.rows[0]
    assert row.change.baseline == pytest.approx(df["tbt_mean_s"].mean())
    assert row.change.change_pct == 0.0
