"""The planner on the real simulator (a tiny toy profile), its per-count metrics, and the price columns."""

from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest

from factories import tiny_profile
from lbbench.errors import InputError
from lbbench.experiment import RunConfig, run_experiment
from lbbench.planning.capacity import SearchTask, point_metrics, run_search
from lbbench.planning.prices import cost_columns, load_prices
from lbbench.metrics.summary import Slo

SLO = Slo(ttft_s=0.5, tbt_s=0.03)


def _toy_task(rate: float = 80.0) -> SearchTask:
    profile = tiny_profile(chunked_prefill=True, max_num_batched_tokens=256)
    run = RunConfig(workload="poisson", rate_per_s=rate, requests=300, prompt_tokens="32", output_tokens="32:0.5",
                    routers=["jsq"], seeds=2, timeline_interval_s=None).resolved()
    return SearchTask({"gpu": "toy", "tp": 1, "router": "jsq", "instance_scheduler": "fcfs"}, profile, run, SLO,
                      0.9, 32, "toy")


def _attainment_by_run_experiment(task: SearchTask, n: int, tmp_path) -> float:
    """The same count through `lbbench run`'s path: run_experiment with --slo, its summary's slo_attainment."""
    cfg = replace(task.run, instances=n, slo={"ttft_s": SLO.ttft_s, "tbt_s": SLO.tbt_s})
    out = run_experiment(cfg, tmp_path / f"n{n}", profile=task.profile)
    return out.summary.filter(pl.col("router") == "jsq")["slo_attainment"][0]


def test_search_on_the_simulator_meets_at_n_and_misses_at_n_minus_one(tmp_path):
    task = _toy_task()
    out = run_search(task)
    res = out.result
    assert res is not None and res.instances > 2  # the toy load needs several instances
    n = res.instances
    assert res.attainment >= 0.9 > res.attainment_at_fewer
    assert set(out.points) == set(res.points) and n - 1 in out.points
    # the attainment is lbbench run --slo's number for the same requests (paired seeds, same runner)
    assert _attainment_by_run_experiment(task, n, tmp_path) == pytest.approx(res.attainment, abs=1e-12)
    assert _attainment_by_run_experiment(task, n - 1, tmp_path) == pytest.approx(res.attainment_at_fewer, abs=1e-12)


def test_paired_seeds_make_every_count_deterministic():
    a, b = run_search(_toy_task(60.0)), run_search(_toy_task(60.0))
    assert a.points == b.points and a.result == b.result


def test_target_out_of_reach_is_reported_not_raised():
    task = replace(_toy_task(), max_instances=2)
    out = run_search(task)
    assert out.result is None and "at 2 instances is below the target 0.9" in out.not_met
    assert set(out.points) == {1, 2}


def _rows(**cols) -> pl.DataFrame:
    n = len(cols["arrival_s"])
    base = {"router": ["jsq"] * n, "seed": [0] * n, "dispatch_s": cols["arrival_s"], "error": [None] * n,
            "tbt_p99_s": cols["tbt_mean_s"], "tbt_max_s": cols["tbt_mean_s"], "num_preemptions": [0] * n}
    return pl.DataFrame({**base, **cols}, schema_overrides={"error": pl.Utf8})


def test_point_metrics_by_hand():
    # four requests arriving at 0..3 s; request 3 misses TTFT (1.5 > 1), request 2 misses TBT (0.2 > 0.1)
    df = _rows(arrival_s=[0.0, 1.0, 2.0, 3.0], first_token_s=[0.5, 1.5, 2.5, 4.5], finish_s=[2.0, 3.0, 6.0, 10.0],
               tbt_mean_s=[0.05, 0.05, 0.2, 0.05], prompt_tokens=[100, 200, 300, 400],
               generated_tokens=[10, 20, 30, 40], output_tokens=[10, 20, 30, 40])
    m = point_metrics(df, Slo(ttft_s=1.0, tbt_s=0.1))
    assert m["attainment"] == pytest.approx(0.5)
    assert m["goodput_per_s"] == pytest.approx(2 / 10.0)  # 2 met, over first arrival -> last finish
    assert m["tokens_per_s"] == pytest.approx((1000 + 100) / 10.0)
    assert m["mean_ttft_s"] == pytest.approx((0.5 + 0.5 + 0.5 + 1.5) / 4)
    assert m["mean_e2e_s"] == pytest.approx((2 + 2 + 4 + 7) / 4)
    assert (m["completed"], m["failed"]) == (4, 0)


def test_cost_columns_by_hand():
    # 3 instances at TP 2 of a 2.5 USD/GPU-hour GPU: 15 USD/h; 500 tokens/s = 1.8 M tokens/h
    c = cost_columns(2.5, instances=3, tp=2, tokens_per_s=500.0)
    assert c["usd_per_hour"] == pytest.approx(15.0)
    assert c["usd_per_million_tokens"] == pytest.approx(15.0 / 1.8)
    assert cost_columns(1.0, 1, 1, None)["usd_per_million_tokens"] is None


@pytest.mark.parametrize("text,problem", [
    ("", "needs a [gpu_usd_per_hour] table"),
    ("[gpu_usd_per_hour]\nnosuch = 1.0\n", "unknown GPU 'nosuch'"),
    ("[gpu_usd_per_hour]\nh100 = -1\n", "h100 = -1"),
    ("[gpu_usd_per_hour]\nh100 = 'cheap'\n", "h100 = 'cheap'"),
    ("[gpu_usd_per_hour\n", "not valid TOML"),
])
def test_bad_price_files_name_the_file_and_key(tmp_path, text, problem):
    p = tmp_path / "prices.toml"
    p.write_text(text)
    with pytest.raises(InputError, match="price_file") as exc:
        load_prices(p)
    assert problem in str(exc.value) and str(p) in str(exc.value)


def test_price_file_aliases_resolve_to_gpu_names(tmp_path):
    p = tmp_path / "prices.toml"
    p.write_text("[gpu_usd_per_hour]\na100 = 1.5\nh100-sxm = 3\n")
    assert load_prices(p) == {"a100-80gb": 1.5, "h100": 3.0}


def test_an_interrupted_plan_keeps_the_searches_that_finished():
    from lbbench.planning import PlanConfig, plan_capacity

    run = RunConfig(workload="paper-mix", rate_per_s=20, requests=200, routers=["jsq"])
    cfg = PlanConfig(run=run, model="llama-3.1-8b", gpus=["h100", "a100-80gb", "l4"], slo=Slo(ttft_s=2, tbt_s=0.1),
                     attainment=0.9)
    seen = []

    def stop_after_two(outcome):
        seen.append(outcome.key["gpu"])
        if len(seen) == 2:
            raise KeyboardInterrupt

    plan = plan_capacity(cfg, on_outcome=stop_after_two)
    assert plan.complete is False and [r["gpu"] for r in plan.rows] == ["h100", "a100-80gb"]
