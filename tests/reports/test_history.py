"""``lbbench history``: four small simulated nights, one on a slower engine, against the first as baseline.

The nights replay the same workload and seeds (paired, as the nightly recipe asks) on copies of the V100 profile
whose per-step base time is scaled: 1.00 (the baseline), 1.01 (within the 3 % gate), 1.15 (the slow night, which
fails it) and 0.97 (faster). Their ``run.toml`` start times and revisions are set so that the table is golden
and the nights are given out of order on purpose.

Regenerate the golden table after an intended change with ``LBBENCH_UPDATE_GOLDEN=1`` (and review its diff).
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest
import tomli_w
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.reports import render as R
from lbbench.reports.compare import compare_runs
from lbbench.reports.history import build_history

GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "history.md"
UPDATE = os.environ.get("LBBENCH_UPDATE_GOLDEN", "") not in ("", "0")
PROFILE = Path(__file__).resolve().parents[2] / "lbbench" / "_profiles" / "llama2-7b-v100.toml"
NIGHTS = {"2025-06-01": 1.00, "2025-06-02": 1.01, "2025-06-03": 1.15, "2025-06-04": 0.97}
RESAMPLES = 200


@pytest.fixture(scope="module")
def nights(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nightly")
    text = PROFILE.read_text()
    base_s = float(re.search(r"^base_s = (.+)$", text, re.M).group(1))
    out = {}
    for k, (day, scale) in enumerate(NIGHTS.items()):
        prof = root / f"engine-{day}.toml"  # same profile name: the runs differ only in the engine's speed
        prof.write_text(re.sub(r"^base_s = .+$", f"base_s = {base_s * scale:.7f}", text, flags=re.M))
        res = CliRunner().invoke(main, ["run", "--profile", str(prof), "--router", "round_robin,jsq",
                                        "--requests", "150", "--seeds", "2", "--rate", "6", "--slo", "ttft=1,e2e=20",
                                        "--timeline-interval", "0", "--out", str(root / day), "--format", "json"],
                                 catch_exceptions=False)
        assert res.exit_code == 0, res.output
        path = root / day / "run.toml"
        doc = tomllib.loads(path.read_text())
        doc["created"], doc["git_revision"] = f"{day}T02:30:00+00:00", f"{k + 1:x}" * 12
        path.write_text(tomli_w.dumps(doc))
        out[day] = root / day
    return out


def test_golden_history_table(nights):
    shuffled = [nights[d] for d in ("2025-06-03", "2025-06-01", "2025-06-04", "2025-06-02")]
    hist = build_history(shuffled, num_resamples=RESAMPLES)
    assert [n.label for n in hist.nights] == list(NIGHTS)  # ordered by their start time
    text = R.to_markdown(hist.tables())
    if UPDATE:
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert list(hist.failed()) == ["2025-06-03"]
    assert hist.metrics == ["mean_e2e_s", "p99_e2e_s", "mean_ttft_s", "p99_ttft_s", "goodput_per_s",
                            "slo_attainment"]


def test_the_gate_is_compares_own_verdict(nights):
    hist = build_history(list(nights.values()), num_resamples=RESAMPLES)
    base = nights["2025-06-01"]
    for day, path in nights.items():
        cmp = compare_runs(base, path, hist.metrics[:4], 3.0, num_resamples=RESAMPLES)
        assert cmp.regressed == (day in hist.failed())
        rows = hist.rows.filter(hist.rows["night"] == day)
        for r in cmp.rows:  # the same change, interval and verdict, row for row
            (mine,) = rows.filter((rows["group"] == r.candidate_router) & (rows["metric"] == r.metric)).to_dicts()
            assert (mine["value"], mine["change_pct"], mine["ci_low_pct"], mine["ci_high_pct"], mine["verdict"]) \
                == (r.change.candidate, r.change.change_pct, r.change.ci_low_pct, r.change.ci_high_pct, r.verdict)


def test_history_through_the_cli_writes_the_page_with_the_failed_night_marked(nights, tmp_path):
    page = tmp_path / "history.html"
    res = CliRunner().invoke(main, ["history", str(nights["2025-06-01"].parent), "--bootstrap", str(RESAMPLES),
                                    "--html", str(page), "--label", "mon", "--label", "tue", "--label", "wed",
                                    "--label", "thu"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "wed" in res.stdout and "FAIL: 4 worse (worst: jsq mean_e2e_s +16.0%)" in res.stdout
    html = page.read_text()
    assert html.count('src="data:image/png;base64,') == 6  # one plot per metric
    assert "FAIL: 4 worse" in html and ">5.26 (+15.7%) FAIL<" in html
    assert "failed the gate (shaded red, failing points crossed): wed" in html
    assert html.count("no night failed the gate") == 0
    bad = CliRunner().invoke(main, ["history", str(nights["2025-06-01"]), "--label", "a", "--label", "b"])
    assert bad.exit_code == 2 and "--label: 2 labels for 1 nights" in bad.stderr
    bad = CliRunner().invoke(main, ["history", str(nights["2025-06-01"]), "--metric", "p42"])
    assert bad.exit_code == 2 and "--metric: unknown metric(s) p42" in bad.stderr
