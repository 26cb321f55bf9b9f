"""The prefill/decode report tables: the TTFT split adds up to the TTFT, by hand on a simulated run, and each
role's load comes from the timeline."""

from __future__ import annotations

import polars as pl
import pytest

from lbbench.core import PairDecision
from lbbench.kv_links import KVLink
from lbbench.reports.disagg import disagg_table, roles_table
from lbbench.rundir.layout import records_frame
from lbbench.sim.disagg import DisaggSim
from factories import req, tiny_profile


class Plan:
    name = "plan"

    def route(self, queue, view, now_s):
        r = queue[0]
        return PairDecision(0, 1, 0 if r.request_id % 2 == 0 else None)  # even ids disaggregate


def test_the_split_adds_up_to_the_ttft_of_the_disaggregated_requests():
    prof = tiny_profile()
    reqs = [req(i, 0.05 * i, 20 + i, 4) for i in range(6)]
    sim = DisaggSim(prof, 2, reqs, roles=["prefill", "decode"], kv_link=KVLink("t", 1e6, 1e-3),
                    kv_bytes_per_token=[1000.0, 1000.0], timeline_interval_s=0.05)
    recs = sim.run(Plan())
    lf = records_frame(recs, {}).lazy()
    t = disagg_table(lf, ["router"]).df.row(0, named=True)
    moved = [r for r in recs if r.prefill_instance is not None]
    assert t["disaggregated"] == pytest.approx(0.5)
    assert t["mean_transfer_s"] == pytest.approx(sum(r.kv_ready_s - r.prefill_done_s for r in moved) / 3)
    assert t["mean_transfer_mb"] == pytest.approx(sum(19 + r.request_id for r in moved) / 3 * 1000 / 1e6)
    parts = sum(t[f"mean_{k}"] for k in ("router_wait_s", "prefill_s", "transfer_s", "decode_wait_s",
                                         "first_step_s"))
    assert parts == pytest.approx(sum(r.first_token_s - r.arrival_s for r in moved) / 3)
    timeline = pl.DataFrame([(s.time_s, s.instance, s.num_running, s.num_waiting, s.kv_usage) for s in sim.timeline],
                            schema=["time_s", "instance", "num_running", "num_waiting", "kv_usage"], orient="row")
    roles = roles_table(timeline.lazy(), [], ["prefill", "decode"]).df
    assert roles["role"].to_list() == ["decode", "prefill"] and roles["instances"].to_list() == [1, 1]
    want = timeline.filter(pl.col("instance") == 1)["num_running"].mean()
    assert roles.filter(pl.col("role") == "decode")["mean_running"].item() == pytest.approx(want)


def test_a_run_without_disaggregation_has_no_table():
    recs = DisaggSim(tiny_profile(), 2, [req(1, 0.0, 20, 4)], roles=["prefill", "decode"],
                     kv_link=KVLink("t", 1e6, 0.0), kv_bytes_per_token=[1.0, 1.0]).run(Plan())
    assert disagg_table(records_frame(recs, {}).lazy(), ["router"]) is None
