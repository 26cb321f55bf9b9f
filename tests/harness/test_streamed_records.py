"""A live run streams its records to disk and holds none of them: ``requests.parquet`` and the summary are what
the records held in memory would have given, column for column and value for value; an interrupted run writes
what it had, marked incomplete."""

from __future__ import annotations

import os
import signal
import tomllib
from dataclasses import fields

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from lbbench.core import RequestRecord
from lbbench.engines.vllm.emulator import EmulatorFleet, FleetConfig
from lbbench.experiment import Reporter, RunConfig, run_experiment
from lbbench.experiment.units import run_columns
from lbbench.harness import replay
from lbbench.rundir import records as record_log
from lbbench.rundir import RecordLog, records_frame
from lbbench.profiles import load_profile
from lbbench.metrics.reference import with_reference
from lbbench.metrics.summary import summarize

PROFILE = "llama3.1-8b-a100-v0"


@pytest.fixture(scope="module")
def fleet():
    with EmulatorFleet(FleetConfig(load_profile(PROFILE), 2)) as f:
        yield f


@pytest.fixture
def kept(monkeypatch):
    """What the replays of a run measured, held here as the client used to hold it: each replay's result and
    its records with their load workers, in the order they ended. Chunks of 7 rows: every unit spans several."""
    runs: list[tuple[object, list[tuple[RequestRecord, int | None]]]] = []
    real_add, real_run = RecordLog.add, replay.run_replay

    def add(self, rec, load_worker=None, **partial_only):
        runs[-1][1].append((RequestRecord(*(getattr(rec, f.name) for f in fields(rec))), load_worker))
        real_add(self, rec, load_worker, **partial_only)

    def run(*a, **kw):
        runs.append((None, []))
        res = real_run(*a, **kw)
        runs[-1] = (res, runs[-1][1])
        return res

    monkeypatch.setattr(record_log, "CHUNK_ROWS", 7)
    monkeypatch.setattr(RecordLog, "add", add)
    monkeypatch.setattr(replay, "run_replay", run)
    return runs


def _in_memory(cfg: RunConfig, runs) -> pl.DataFrame:
    """``requests.parquet`` as the client built it from records held in memory (before they were streamed)."""
    cfg = cfg.resolved()
    profile = load_profile(PROFILE)
    variant = cfg.variants()[0]
    names = [p.name for p in cfg.fleet_of(profile).profiles()]
    frames = []
    for res, held in runs:
        recs = [r for r, _ in held]
        df = records_frame(recs, run_columns(cfg, profile, variant, cfg.fleet_of(profile)))
        df = df.with_columns(pl.Series("instance_profile", [names[r.instance] if 0 <= r.instance < len(names)
                                                            else None for r in recs], dtype=pl.Utf8))
        if res.clock_offsets is not None:
            wid = [w for _, w in held]
            df = df.with_columns([pl.Series("load_worker", wid), pl.Series(
                "clock_offset_s", [res.clock_offsets[w] if w is not None else None for w in wid])])
        at = res.saturated_at_s
        # a Poisson workload names no prefix hashes and does not mean to reuse prefixes (the prefix-hit check)
        frames.append(df.with_columns(pl.lit(at is not None).alias("saturated"),
                                      pl.lit(at, dtype=pl.Float64).alias("saturated_at_s"),
                                      pl.lit(None, dtype=pl.Float64).alias("intended_prefix_hit_rate"),
                                      pl.lit(False).alias("reuse_intended")))
    return pl.concat(frames, how="diagonal_relaxed")


@pytest.mark.parametrize("load_workers", [0, 1])
def test_a_streamed_live_run_writes_what_records_in_memory_gave(fleet, kept, tmp_path, load_workers):
    cfg = RunConfig(endpoints=fleet.endpoints, profile=PROFILE, workload="poisson", rate_per_s=20.0, requests=40,
                    routers=["round_robin", "least_requests"], prompt_tokens="64", output_tokens="8",
                    timeline_interval_s=None, load_workers=load_workers)
    out = run_experiment(cfg, tmp_path / "run", reporter=Reporter())
    assert out.complete and len(kept) == 2 and all(len(held) == 40 for _, held in kept)
    written = pl.read_parquet(out.path / "requests.parquet")
    expected = _in_memory(cfg, kept)
    assert_frame_equal(written, expected, check_exact=True)
    assert ("load_worker" in written.columns) == bool(load_workers)
    # the summary: the one the in-memory rows give
    by = cfg.resolved().group_keys()
    assert_frame_equal(pl.read_parquet(out.path / "summary.parquet"),
                       with_reference(summarize(expected, by=by), expected, by), check_exact=True)
    # each unit's records are in its partial folder: the JSON lines and the Parquet chunks (40 rows: 6 chunks)
    for unit in ("round_robin-seed0", "least_requests-seed0"):
        folder = out.path / "partial" / unit
        assert len(sorted(folder.glob("records-*.parquet"))) == 6
        assert sum(1 for _ in (folder / record_log.PARTIAL_RECORDS).open()) == 40


class _Interrupt(Reporter):
    """Ctrl-C once ``after`` requests of the first unit have ended."""

    def __init__(self, after: int):
        self.after, self.sent = after, False

    def unit_progress(self, label: str, done: int, total: int) -> None:
        if done >= self.after and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupted_live_run_writes_what_it_had_incomplete(fleet, kept, tmp_path):
    cfg = RunConfig(endpoints=fleet.endpoints, profile=PROFILE, workload="poisson", rate_per_s=20.0, requests=200,
                    routers=["round_robin", "least_requests"], prompt_tokens="64", output_tokens="8",
                    timeline_interval_s=None, load_workers=0)
    out = run_experiment(cfg, tmp_path / "run", reporter=_Interrupt(after=15))
    assert not out.complete
    doc = tomllib.loads((out.path / "run.toml").read_text())
    assert doc["complete"] is False and [u["complete"] for u in doc["units"]] == [False]
    written = pl.read_parquet(out.path / "requests.parquet")
    partial = pl.read_ndjson(out.path / "partial" / "round_robin-seed0" / record_log.PARTIAL_RECORDS)
    assert 15 <= written.height == partial.height == len(kept[0][1]) < 200
    assert written["request_id"].to_list() == partial["request_id"].to_list()  # every record, in order
    assert_frame_equal(written, _in_memory(cfg, kept), check_exact=True)
