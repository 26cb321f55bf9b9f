"""``plan --disagg``: the prefill/decode search on ``plan --mix``'s machinery finds the cheapest split of a known
threshold and checks n / n - 1 along each role, the CLI runs end to end, Ctrl-C keeps what completed, and bad
input is one line naming the flag, exit 2."""

from __future__ import annotations

import itertools
import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.cli import main
from lbbench.experiment import RunConfig
from lbbench.planning import disagg as disagg_mod
from lbbench.planning.mix import GpuType, holds_every_role, ray_bases, search_mix

RUN = RunConfig(routers=["pd_joint"])


def _pd_types(prices):
    """Each GPU g0, g1, ... as prefill, then as decode."""
    return [GpuType(f"g{i}", 1, "unused", p, role) for role in ("prefill", "decode") for i, p in enumerate(prices)]


def test_a_known_threshold_gives_the_minimal_counts_and_one_fewer_of_each_role_misses():
    types = _pd_types([1.0])
    seen = []

    def attainment(v):  # meets (0.95) with >= 3 prefill and >= 2 decode instances, else 0.5
        seen.append(v)
        return 0.95 if v[0] >= 3 and v[1] >= 2 else 0.5

    res = search_mix(RUN, types, 0.9, 16, 1000, 1.0, evaluate=attainment, plenty=8)
    assert res.best == (3, 2) and res.cost(res.best) == 5
    assert res.uniform == {"g0:prefill": 3, "g0:decode": 2}  # step 1, the other role held at 8
    assert res.fewer == {"g0:prefill": 0.5, "g0:decode": 0.5}  # 2P+2D and 3P+1D both miss
    assert (2, 2) in res.points and (3, 1) in res.points and not res.replaced
    assert all(holds_every_role(types, v) for v in seen)  # never a fleet without one of the roles


def test_a_non_minimal_answer_is_replaced_and_said():
    types = _pd_types([1.0])

    def attainment(v):  # 2P+2D meets, but 2P+8D (step 1) misses: not monotone in the decode count
        if v == (2, 8):
            return 0.5
        return 0.95 if v[0] >= 2 and v[1] >= 2 else 0.5

    res = search_mix(RUN, types, 0.9, 16, 1000, 1.0, evaluate=attainment, plenty=8)
    assert res.best == (2, 2) and res.replaced == [(3, 2)]  # the walk skipped 2P+2D (below the miss 2P+8D)
    assert res.fewer == {"g0:prefill": 0.5, "g0:decode": 0.5}


def test_without_its_last_prefill_instance_the_decode_instances_are_checked_and_a_met_one_is_said():
    types = _pd_types([1.0])
    res = search_mix(RUN, types, 0.9, 16, 1000, 1.0, evaluate=lambda v: 0.95 if v[1] >= 3 else 0.0, plenty=4)
    # 0P+3D (the decode instances serving whole) still meets: reported, never the P/D answer
    assert res.best == (1, 3) and res.fewer == {"g0:prefill": 0.95, "g0:decode": 0.0}
    assert res.still_met == ["g0:prefill"] and (0, 3) in res.points


def test_without_its_last_decode_instance_nothing_decodes():
    types = _pd_types([1.0])
    res = search_mix(RUN, types, 0.9, 16, 1000, 1.0, evaluate=lambda v: 0.95 if v[0] >= 3 and v[1] else 0.0,
                     plenty=4)
    assert res.best == (3, 1) and res.fewer == {"g0:prefill": 0.0, "g0:decode": None} and not res.still_met


@settings(max_examples=40, deadline=None)
@given(speeds=st.lists(st.tuples(st.floats(0.5, 4.0), st.floats(0.5, 4.0)), min_size=1, max_size=2),
       prices=st.data(), demand=st.tuples(st.floats(1.0, 8.0), st.floats(1.0, 8.0)))
def test_the_chosen_split_is_the_cheapest_evaluated_and_the_cheapest_of_all(speeds, prices, demand):
    usd = prices.draw(st.lists(st.floats(0.5, 4.0), min_size=len(speeds), max_size=len(speeds)))
    types = _pd_types(usd)
    k = len(speeds)

    def attainment(v):  # each role must carry its phase's demand (a separable capacity model)
        pre = sum(c * s[0] for c, s in zip(v[:k], speeds))
        dec = sum(c * s[1] for c, s in zip(v[k:], speeds))
        return 1.0 if pre >= demand[0] and dec >= demand[1] else 0.5

    res = search_mix(RUN, types, 0.9, 12, 100_000, 1.0, evaluate=attainment)
    cost = res.cost
    feasible = [v for v in itertools.product(range(13), repeat=2 * k)
                if holds_every_role(types, v) and attainment(v) >= 0.9]
    rays = [tuple(12 if j == i else c for j, c in enumerate(b)) for i, b in enumerate(ray_bases(types, 12))]
    if not any(attainment(v) >= 0.9 for v in rays):  # no one-GPU-per-role fleet meets within 12 of each: step 1
        assert res.best is None  # finds no cost bound and the search stops, as plan --mix's does
        return
    assert res.best is not None and cost(res.best) == pytest.approx(min(map(cost, feasible)))
    met = [v for v, a in res.points.items() if a >= 0.9 and holds_every_role(types, v)]
    assert cost(res.best) <= min(map(cost, met)) + 1e-9  # the cheapest feasible point it evaluated
    assert all(a is None or a < 0.9 for a in res.fewer.values()) and not res.still_met
    assert set(res.fewer) == {t.label for t, c in zip(types, res.best) if c}


BASE = ["plan", "--disagg", "--workload", "poisson", "--prompt-tokens", "3000:0.5", "--output-tokens", "64:0.5",
        "--rate", "8", "--requests", "150", "--slo", "ttft=1,tbt=0.03", "--attainment", "0.9",
        "--model", "llama-3.1-8b"]


def test_plan_disagg_end_to_end_through_the_cli(tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text("[gpu_usd_per_hour]\na100-80gb = 2.0\nh100 = 4.0\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, [*BASE, "--gpu", "a100,h100", "--price-file", str(prices), "--format", "json",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["complete"] and set(doc["layouts"]) == {"aggregated", "disaggregated"}
    agg, pd = doc["layouts"]["aggregated"], doc["layouts"]["disaggregated"]
    assert pd["router"] == "pd_joint" and doc["kv_link"] == "rdma-400g"
    assert {k.split(":")[1] for k in pd["counts"]} == {"prefill", "decode"}  # both roles, GPU type per role
    for lay in (agg, pd):
        assert lay["search_attainment"] >= 0.9 and 0 <= lay["check"]["attainment"] <= 1
        fewer = lay["attainment_with_one_fewer"]
        assert lay["minimal"] == all(a is None or a < 0.9 for a in fewer.values())
        assert all(a < 0.9 for k, a in fewer.items() if a is not None and not k.endswith(":prefill"))
        assert lay["goodput_per_gpu_hour"] == pytest.approx(lay["check"]["goodput_per_s"] * 3600 / lay["gpus"])
    chosen, other = doc["layouts"][doc["chosen"]], [v for k, v in doc["layouts"].items() if k != doc["chosen"]][0]
    assert chosen["cost"] <= other["cost"]
    assert other["equal_cost_cost"] is None or other["equal_cost_cost"] <= chosen["cost"] + 1e-9
    if pd["equal_cost_fleet"] != "-":  # at equal cost, a P/D fleet still (never its decode instances alone)
        assert ":prefill" in pd["equal_cost_fleet"] and ":decode" in pd["equal_cost_fleet"]
    lines = [json.loads(x) for x in (out / "points.jsonl").read_text().splitlines()]
    n_searched = sum(s["evaluations"] for k in ("aggregated", "disaggregated") for s in doc["searches"][k])
    assert len(lines) == n_searched and {x["layout"] for x in lines} == {"aggregated", "disaggregated"}
    assert json.loads((out / "disagg.json").read_text())["chosen"] == doc["chosen"]


def test_the_table_names_the_plan():
    res = CliRunner().invoke(main, [*BASE, "--gpu", "a100", "--pd-router", "pd_llmd_always", "--kv-link", "nvlink4"])
    assert res.exit_code == 0, res.output
    assert "plan: " in res.stdout and "pd_llmd_always" in res.stdout and "nvlink4" in res.stdout


def test_ctrl_c_keeps_what_completed(tmp_path, monkeypatch):
    real = disagg_mod.search_mix

    def interrupted(run, types, *a, **kw):
        if any(t.role != "mixed" for t in types):
            raise KeyboardInterrupt
        return real(run, types, *a, **kw)

    monkeypatch.setattr(disagg_mod, "search_mix", interrupted)
    res = CliRunner().invoke(main, [*BASE, "--gpu", "a100", "--out", str(tmp_path)])
    assert res.exit_code == 130, res.output
    doc = json.loads((tmp_path / "disagg.json").read_text())
    assert not doc["complete"] and len(doc["searches"]["aggregated"]) == 1 and not doc["searches"]["disaggregated"]
    assert (tmp_path / "points.jsonl").read_text().count("aggregated") == doc["searches"]["aggregated"][0][
        "evaluations"]


@pytest.mark.parametrize("args, says", [
    (["--gpu", "a100", "--pd-router", "pd_joint"], "--pd-router: "),
    (["--gpu", "a100", "--kv-link", "nvlink4"], "--kv-link: "),
    (["--gpu", "a100", "--router", "pd_joint"], "--router: pd_joint routes prefill/decode pairs: plan them"),
    (["--disagg", "--gpu", "a100", "--router", "pd_dynamo"], "--router: pd_dynamo routes prefill/decode pairs: give"),
    (["--disagg", "--gpu", "a100", "--mix"], "--mix: "),
    (["--disagg", "--gpu", "a100", "--format", "html"], "--format: "),
    (["--disagg", "--gpu", "a100", "--jobs", "2"], "--jobs: "),
    (["--disagg", "--gpu", "a100", "--pd-router", "jsq"], "--pd-router: 'jsq' is not a prefill/decode pair router"),
    (["--disagg", "--gpu", "a100", "--kv-link", "0"], "--kv-link: "),
    (["--disagg", "--gpu", ","], "--gpu: "),
])
def test_bad_disagg_input_is_one_line_and_exit_2(args, says):
    base = [a for a in BASE if a != "--disagg"]
    res = CliRunner().invoke(main, [*base, *args])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].removeprefix("Error: ").startswith(says), lines


def test_the_fleets_tried_at_equal_cost_by_hand():
    agg = search_mix(RUN, [GpuType("g0", 1, "unused", 2.0), GpuType("g1", 1, "unused", 4.0)], 0.9, 8, 0, 1.0,
                     evaluate=lambda v: 0.95 if 2 * v[0] + 5 * v[1] >= 10 else 0.2 * v[0] + 0.1 * v[1])
    # simulated within $5: 1 x g0 (0.2, $2), 2 x g0 (0.4, $4), 1 x g1 (0.1, $4); then each type alone at what $5 buys
    assert disagg_mod.within(agg, 5.0) == [(2, 0), (0, 1)]
    pd = search_mix(RUN, _pd_types([1.0]), 0.9, 8, 1000, 1.0, evaluate=lambda v: 0.95 if min(v) >= 2 else 0.1 * sum(v),
                    plenty=4)
    picked = disagg_mod.within(pd, 3.0)  # a P/D fleet only: never the decode instances alone, no fills
    assert len(picked) == 1 and holds_every_role(pd.types, picked[0]) and sum(picked[0]) <= 3


def test_a_target_out_of_reach_is_said_in_one_line():
    args = [a if a != "ttft=1,tbt=0.03" else "ttft=0.001" for a in BASE]
    res = CliRunner().invoke(main, [*args, "--gpu", "a100", "--max-instances", "2"])
    assert res.exit_code == 0, res.output
    assert "no fleet of either layout met the target within --max-instances" in res.stdout
