"""Golden tables: the report over the committed run directories must not drift.

Regenerate after an intended change with ``LBBENCH_UPDATE_GOLDEN=1 pytest tests/reports``
(and review the diff of ``data/golden/``).
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from lbbench.rundir import load_runs
from lbbench.metrics.summary import summarize
from lbbench.reports.tables import Slo, build_tables

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
UPDATE = os.environ.get("LBBENCH_UPDATE_GOLDEN", "") not in ("", "0")
NUM_RESAMPLES = 200


def _check(name: str, df: pl.DataFrame) -> None:
    path = GOLDEN / f"{name}.parquet"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        df.write_parquet(path)
        return
    assert path.is_file(), f"missing golden {path.name}; run with LBBENCH_UPDATE_GOLDEN=1"
    assert_frame_equal(df, pl.read_parquet(path), check_exact=False, rel_tol=1e-6, abs_tol=1e-9)


def _tables(paths, slo=None):
    runs = load_runs(paths)
    return {t.name: t.df for t in build_tables(runs.requests, runs.group_keys(), slo=slo,
                                               num_resamples=NUM_RESAMPLES)}


def test_golden_summary(v100_run):
    _check("summary_v100", summarize(pl.scan_parquet(v100_run / "requests.parquet")))


def test_summary_parquet_matches_summarize(v100_run, a100_run):
    for run in (v100_run, a100_run):
        stored = pl.read_parquet(run / "summary.parquet")
        assert_frame_equal(stored, summarize(pl.read_parquet(run / "requests.parquet")))


@pytest.mark.parametrize("name", ["main", "latency", "balance", "imbalance", "instances"])
def test_golden_single_run(v100_run, name):
    _check(f"v100_{name}", _tables([v100_run])[name])


@pytest.mark.parametrize("name", ["main", "hardware", "latency"])
def test_golden_hardware_pair(v100_run, a100_run, name):
    _check(f"hardware_{name}", _tables([v100_run, a100_run])[name])


@pytest.mark.parametrize("name", ["main", "live", "goodput"])
def test_golden_live(live_run, name):
    _check(f"live_{name}", _tables([live_run], slo=Slo(ttft_s=2.0, tbt_s=0.05, e2e_s=20.0))[name])
