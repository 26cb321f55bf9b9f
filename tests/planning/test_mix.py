"""``plan --mix``: the cheapest fleet under a toy capacity model equals brute force, n / n - 1 holds along
every GPU type of the answer on the simulator, and bad input is one line, exit 2."""

from __future__ import annotations

import itertools
import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.cli import main
from lbbench.experiment import RunConfig
from lbbench.planning.mix import GpuType, search_mix


def _types(prices):
    return [GpuType(f"g{i}", 1, "unused", p) for i, p in enumerate(prices)]


@settings(max_examples=60, deadline=None)
@given(speeds=st.lists(st.floats(0.5, 5.0), min_size=2, max_size=3), prices=st.data(),
       demand=st.floats(2.0, 12.0))
def test_the_cheapest_fleet_of_a_capacity_model_is_found_and_checked(speeds, prices, demand):
    usd = prices.draw(st.lists(st.floats(0.5, 4.0), min_size=len(speeds), max_size=len(speeds)))
    types = _types(usd)

    def attainment(v):  # meets (1.0) once the fleet's capacity carries the demand
        return 1.0 if sum(c * s for c, s in zip(v, speeds)) >= demand else 0.5

    run = RunConfig(routers=["jsq"])
    res = search_mix(run, types, 0.9, 40, 10_000, 0.0, evaluate=attainment)
    cost = res.cost
    best = min((v for v in itertools.product(*(range(0, 41) for _ in speeds)) if attainment(v) >= 0.9),
               key=cost)
    assert res.best is not None and cost(res.best) == pytest.approx(cost(best))
    assert cost(res.best) <= cost(res.cheapest_uniform) + 1e-9
    assert attainment(res.best) >= 0.9 and not res.bounded
    for label, a in res.fewer.items():  # one fewer of any type in the answer misses
        assert a < 0.9
    assert set(res.fewer) == {t.label for t, c in zip(types, res.best) if c}


def test_a_capped_search_says_so():
    types = _types([1.0, 1.0])
    run = RunConfig(routers=["jsq"])
    res = search_mix(run, types, 0.9, 40, 0, 0.0,
                     evaluate=lambda v: 1.0 if 3 * v[0] + 2 * v[1] >= 10 else 0.0)
    assert res.bounded and res.best == res.cheapest_uniform == (4, 0)


BASE = ["plan", "--mix", "--workload", "paper-mix", "--rate", "8", "--requests", "150", "--slo", "ttft=2,tbt=0.1",
        "--attainment", "0.9", "--model", "llama-3.1-8b"]


def test_mix_on_the_simulator_meets_and_one_fewer_of_each_gpu_misses(tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text("[gpu_usd_per_hour]\na100-80gb = 2.0\nl4 = 1.0\n")
    res = CliRunner().invoke(main, [*BASE, "--gpu", "a100-80gb,l4", "--router", "round_robin,jsq_speed",
                                    "--price-file", str(prices), "--min-capacity", "0", "--format", "json",
                                    "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [s["router"] for s in doc["searches"]] == ["round_robin", "jsq_speed"]
    for s in doc["searches"]:
        assert s["best_attainment"] >= 0.9 and s["best_cost"] <= s["cheapest_uniform_cost"]
        held = [k for k, c in s["best_counts"].items() if c]
        assert held and set(s["attainment_with_one_fewer"]) == set(held)
        assert all(a < 0.9 for a in s["attainment_with_one_fewer"].values())
        for k, n in s["uniform"].items():  # each uniform count: n meets, n - 1 misses
            pts = {tuple(p["counts"]): p["attainment"] for p in s["points"]}
            i = list(s["best_counts"]).index(k)
            unit = lambda m: tuple(m if j == i else 0 for j in range(len(s["best_counts"])))  # noqa: E731
            assert pts[unit(n)] >= 0.9 and (n == 1 or pts[unit(n - 1)] < 0.9)
    assert (tmp_path / "out" / "mix.json").is_file()


@pytest.mark.parametrize("extra, says", [
    (["--gpu", "a100-80gb", "--format", "html"], "--format table or json"),
    (["--gpu", "a100-80gb", "--max-evaluations", "-1"], "--max-evaluations: -1: must be >= 0"),
    (["--gpu", "a100-80gb", "--min-capacity", "-0.5"], "--min-capacity: -0.5: must be >= 0"),
    (["--gpu", "a100-80gb,nosuchgpu"], "nosuchgpu"),
])
def test_bad_mix_input_is_one_line_and_exit_2(extra, says):
    res = CliRunner().invoke(main, [*BASE, *extra])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0]
