"""A load sweep's HTML report holds its three sweep figures per router: tokens/s per instance against tokens/s
per user, goodput and p99 TTFT against the rate; without an SLO it says goodput counts every completed request."""

from __future__ import annotations

import html as _html
import re

import pytest

from lbbench.experiment import RunConfig, run_experiment
from lbbench.reports import plots
from lbbench.rundir import load_runs
from lbbench.reports.report import build_report
from lbbench.reports.tables import Slo

CAPTIONS = [caption for _, _, caption in plots.SWEEP_FIGURES]


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "run"
    cfg = RunConfig(profile="llama2-7b-v100", instances=2, workload="poisson", rates=[2.0, 8.0, 32.0],
                    rate_per_s=None, requests=60, routers=["round_robin", "jsq"], timeline_interval_s=5.0)
    run_experiment(cfg, out, run_id="sweepplots01")
    return out


def _figures(html: str) -> dict[str, str]:
    """caption -> base64 PNG of every figure of the page."""
    return {_html.unescape(cap): data for data, cap in re.findall(
        r'<img class="plot" alt="[^"]*" src="data:image/png;base64,([^"]+)"><figcaption>([^<]*)</figcaption>', html)}


def test_sweep_html_has_the_three_figures(sweep_run):
    html = build_report([sweep_run], num_resamples=50).render("html")
    assert "<h2>Load sweep</h2>" in html
    figs = _figures(html)
    for caption in CAPTIONS:
        hits = [c for c in figs if c.startswith(caption)]
        assert len(hits) == 1, caption
        assert len(figs[hits[0]]) > 2000  # a real image
    goodput = next(c for c in figs if c.startswith("Goodput"))
    assert "no SLO was given" in goodput


def test_sweep_goodput_with_slo(sweep_run):
    slo = Slo(ttft_s=1.0)
    html = build_report([sweep_run], slo=slo, num_resamples=50).render("html")
    goodput = next(c for c in _figures(html) if c.startswith("Goodput"))
    assert "no SLO" not in goodput and slo.describe() in goodput


def test_sweep_points_per_router(sweep_run):
    runs = load_runs([sweep_run])
    pts = plots.sweep_points(runs.requests, ["router", "rate_per_s"])
    assert pts is not None and pts.height == 6
    for router in ("round_robin", "jsq"):
        g = pts.filter(pts["router"] == router).sort("rate_per_s")
        assert g["rate_per_s"].to_list() == [2.0, 8.0, 32.0]
        per_instance = g["tokens_per_s_per_instance"].to_list()
        assert per_instance == sorted(per_instance)  # more load, more tokens per instance (unsaturated)
        assert all(v > 0 for v in g["tokens_per_s_per_user"].to_list())
        assert per_instance[0] == pytest.approx(g["throughput_tokens_per_s"][0] / 2)


def test_no_sweep_figures_for_one_rate(v100_run):
    html = build_report([v100_run], num_resamples=50).render("html")
    assert "Load sweep" not in html
