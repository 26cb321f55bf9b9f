"""Flow control and stale signals on a live replay (``lbbench run --endpoint``), through the one ``Drive`` the
simulator's dispatcher and ``lbbench proxy`` share: a request shed at the client's gateway is a record with its
429/503 (never sent) that goodput and met SLO count as a miss; a signal lag delays what the router sees of the
endpoints; bad flow-control specs and a negative lag are one line naming the flag, exit 2, on the live path too."""

from __future__ import annotations

import polars as pl
import pytest
from click.testing import CliRunner

from lbbench.admission import AdmissionSpec
from lbbench.cli import main
from lbbench.core import ClusterView, Request
from lbbench.harness.replay import ReplaySettings, run_replay

NUM_REQUESTS = 120


def test_live_replay_with_admission_sheds_requests_as_records(a100_fleet, tmp_path):
    out = tmp_path / "r"
    # two emulated A100s, at most 2 in flight on each and 2 held: 60 req/s of paper-mix is far more than that
    res = CliRunner().invoke(main, [
        "run", "--profile", "llama3.1-8b-a100-v0", *[a for u in a100_fleet.endpoints for a in ("--endpoint", u)],
        "--workload", "paper-mix", "--rate", "60", "--requests", str(NUM_REQUESTS), "--router", "least_requests",
        "--admission", "max_queue=2,max_outstanding=2", "--tenants", "gold:1@1,std@3", "--signal-lag-s", "0.2",
        "--slo", "ttft=2", "--timeline-interval", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "flow control: admitted load least_requests" in res.output
    df = pl.read_parquet(out / "requests.parquet")
    assert df.height == NUM_REQUESTS and df["request_id"].n_unique() == NUM_REQUESTS  # nothing lost, none twice
    shed = df.filter(pl.col("http_status").is_in([429, 503]))
    assert shed.height > 0
    assert (shed["instance"] == -1).all() and shed["error"].str.starts_with("shed by flow control").all()
    assert shed["actual_send_s"].is_null().all() and (shed["generated_tokens"] == 0).all()  # never sent
    assert (shed["dispatch_s"] >= shed["arrival_s"]).all()
    served = df.filter(pl.col("http_status").is_null() | (pl.col("http_status") == 200))
    assert served.height + shed.height == NUM_REQUESTS
    assert set(df["tenant"].unique()) <= {"gold", "std"}
    assert (df.filter(pl.col("tenant") == "gold")["priority_band"] == 1).all()
    row = pl.read_parquet(out / "summary.parquet").to_dicts()[0]
    assert row["shed"] == shed.height and row["failed"] >= shed.height
    met_at_most = (NUM_REQUESTS - shed.height) / NUM_REQUESTS
    assert row["slo_attainment"] <= met_at_most  # a shed request is a miss
    span = df["arrival_s"].max() - df["arrival_s"].min()
    assert row["goodput_per_s"] <= (NUM_REQUESTS - shed.height) / span + 1e-9
    assert row["admitted_rate_per_s"] == pytest.approx((NUM_REQUESTS - shed.height) / span)


class _Watcher:
    """Sends every request to instance 0 and keeps the in-flight count it saw there at each decision."""

    name = "watcher"

    def __init__(self) -> None:
        self.seen: list[int] = []

    def route(self, queue, view: ClusterView, now_s: float):
        self.seen.append(view.instances[0].num_outstanding)
        return 0, 0


@pytest.mark.parametrize("lag_s", [0.0, 1000.0])
def test_live_replay_router_sees_finishes_only_after_the_signal_lag(zero_fleet, lag_s):
    # one request every 0.25 s, each done long before the next on a zero-latency emulator
    reqs = [Request(i, 0.25 * i, 16, 2) for i in range(8)]
    router = _Watcher()
    res = run_replay(reqs, router, zero_fleet.endpoints[:1],
                     ReplaySettings(run_id="lag", seed=0, scrape_interval_s=None, signal_lag_s=lag_s))
    assert res.complete and all(r.error is None for r in res.records)
    if lag_s:
        assert router.seen == list(range(8))  # its own dispatches at once, no finish within the lag
    else:
        assert router.seen[-1] < 7  # finishes reach it (how many by the last decision depends on the host)


def test_live_replay_admission_in_the_library(a100_fleet):
    """``ReplaySettings(admission=...)`` alone: every request has exactly one record, shed ones never sent."""
    reqs = [Request(i, 0.0, 64, 64) for i in range(12)]  # a burst: 1 in flight, 2 held, 9 shed on arrival
    res = run_replay(reqs, _Watcher(), a100_fleet.endpoints[:1],
                     ReplaySettings(run_id="adm", seed=0, scrape_interval_s=None,
                                    admission=AdmissionSpec(max_queue=2, max_outstanding=1)))
    recs = sorted(res.records, key=lambda r: r.request_id)
    assert res.complete and [r.request_id for r in recs] == list(range(12))
    assert [r.http_status for r in recs if r.error is not None] == [429] * 9
    assert sum(r.error is None for r in recs) == 3


@pytest.mark.parametrize("flag, value, says", [
    ("--admission", "max_queue=-1", "--admission: max_queue=-1 must be >= 0"),
    ("--admission", "max_queue=lots", "--admission: max_queue='lots' is not an integer"),
    ("--tenants", "gold:high", "--tenants: 'gold:high': priority 'high' is not an integer"),
    ("--tenants", "gold,gold", "--tenants: 'gold' given twice"),
    ("--signal-lag-s", "-1", "--signal-lag-s: -1 must be >= 0 seconds"),
])
def test_bad_flow_control_on_the_live_path_is_one_line(tmp_path, flag, value, says):
    # refused before any endpoint is contacted (this one answers nothing)
    res = CliRunner().invoke(main, ["run", "--endpoint", "http://127.0.0.1:9", "--requests", "5", flag, value,
                                    "--out", str(tmp_path / "r")])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: {says}"), res.output
