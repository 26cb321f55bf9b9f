"""``lbbench run --find-rate``: a bracket whose bottom meets and top misses on the simulator, probes kept as
runs, and the bad-input lines."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.experiment import RunConfig, run_experiment
from lbbench.planning.find_rate import FindRateConfig, find_rates, rate_dir
from lbbench.profiles import load_profile

SLO = {"ttft_s": 2.0, "tbt_s": 0.1}


def _run(**kw) -> RunConfig:
    return RunConfig(profile="llama2-7b-v100", instances=2, workload="poisson", prompt_tokens="128:0.5",
                     output_tokens="64:0.5", requests=120, routers=["round_robin", "jsq"], seeds=2, slo=dict(SLO),
                     timeline_interval_s=None, rate_per_s=None, **kw)


def _mean_attainment(cfg: RunConfig, rate: float, router: str, path) -> float:
    out = run_experiment(replace(cfg, rate_per_s=rate, routers=[router]), path)
    return float(out.summary["slo_attainment"].mean())


def test_the_found_rate_meets_and_the_bracket_top_misses(tmp_path):
    fc = FindRateConfig(_run(), attainment=0.9, start_per_s=4.0, rel_tol=0.05)
    rows = find_rates(fc, tmp_path / "fr", load_profile("llama2-7b-v100"))
    assert [(r.router, r.instance_scheduler) for r in rows] == [("round_robin", "fcfs"), ("jsq", "fcfs")]
    for row in rows:
        lo, hi = row.result.bracket
        assert lo is not None and hi is not None and lo < hi and row.result.converged
        assert row.result.rate == lo and row.result.attainment >= 0.9
        for rate, probe in row.probes.items():  # every seed run of every probe is a run directory
            for k in range(probe.seeds_run):
                assert (rate_dir(tmp_path / "fr", row.router, "fcfs", rate) / f"seed{k}" / "run.toml").is_file()
        # confirming runs on every seed (one run directory each): the rate meets, the bracket's top does not
        cfg = _run()
        assert _mean_attainment(cfg, lo, row.router, tmp_path / f"{row.router}-lo") >= 0.9
        assert _mean_attainment(cfg, hi, row.router, tmp_path / f"{row.router}-hi") < 0.9
    doc = json.loads((tmp_path / "fr" / "find_rate.json").read_text())
    assert [r["router"] for r in doc["rows"]] == ["round_robin", "jsq"] and doc["attainment"] == 0.9


BASE = ["run", "--find-rate", "--workload", "poisson", "--requests", "20", "--instances", "1"]


@pytest.mark.parametrize("extra, says", [
    ([], "--find-rate needs --slo"),
    (["--slo", "ttft=2", "--rate", "5"], "drop --rate"),
    (["--slo", "ttft=2", "--attainment", "1.5"], "must be in (0, 1]"),
    (["--slo", "ttft=2", "--find-rate-tol", "0"], "--find-rate-tol: 0 must be > 0"),
])
def test_bad_find_rate_input_is_one_line_and_exit_2(tmp_path, extra, says):
    res = CliRunner().invoke(main, [*BASE, *extra, "--out", str(tmp_path / "r")])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0]
    assert not (tmp_path / "r").exists()


def test_find_rate_through_the_cli_prints_the_table(tmp_path):
    res = CliRunner().invoke(main, [*BASE, "--requests", "60", "--slo", "ttft=2,tbt=0.1", "--attainment", "0.9",
                                    "--find-rate-start", "2", "--find-rate-tol", "0.1", "--format", "json",
                                    "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (row,) = doc["rows"]
    assert row["router"] == "round_robin" and row["bracket"][0] == row["rate_per_s"] < row["bracket"][1]
