"""The per-instance table: profile, requests served, busy fraction, preemptions, mean E2E."""

from __future__ import annotations

import polars as pl
import pytest

from lbbench.reports import render as R
from lbbench.reports.tables import instances_table


def _rows(**cols):
    n = len(cols["instance"])
    base = {"router": ["rr"] * n, "seed": [0] * n, "prompt_tokens": [10] * n, "generated_tokens": [5] * n,
            "first_token_s": cols["dispatch_s"], "error": [None] * n}
    return pl.DataFrame({**base, **cols}, schema_overrides={"error": pl.String})


def test_busy_fraction_is_the_union_of_dispatch_to_finish_over_the_span():
    # instance 0: [1, 4] and [2, 3] overlap -> 3 s busy, then [6, 7] -> 4 s in all
    # instance 1 (the slow profile): [0, 10] -> 10 s; span: first arrival 0 to last finish 10
    df = _rows(instance=[0, 0, 0, 1], instance_profile=["a100", "a100", "a100", "l4"],
               arrival_s=[1.0, 2.0, 6.0, 0.0], dispatch_s=[1.0, 2.0, 6.0, 0.0], finish_s=[4.0, 3.0, 7.0, 10.0],
               num_preemptions=[0, 1, 1, 2])
    t = instances_table(df.lazy(), ["router"])
    rows = t.df.to_dicts()
    assert [r["instance"] for r in rows] == [0, 1]
    assert [r["instance_profile"] for r in rows] == ["a100", "l4"]
    assert [r["requests"] for r in rows] == [3.0, 1.0]
    assert [r["busy_fraction"] for r in rows] == pytest.approx([0.4, 1.0])
    assert [r["preemptions"] for r in rows] == [2.0, 2.0]
    assert [r["mean_e2e_s"] for r in rows] == pytest.approx([(3 + 1 + 1) / 3, 10.0])
    headers, cells = R.display(t)
    assert headers[:5] == ["router", "instance", "profile", "requests served", "busy fraction"]


def test_seeds_are_averaged_and_failed_requests_count_as_served_not_in_e2e():
    df = _rows(instance=[0, 0, 0], instance_profile=["a", "a", "a"], arrival_s=[0.0, 0.0, 0.0],
               dispatch_s=[0.0, 0.0, 0.0], finish_s=[2.0, 4.0, None], num_preemptions=[0, 0, 0])
    df = df.with_columns(seed=pl.Series([0, 1, 1]),
                         error=pl.Series([None, None, "HTTP 500"], dtype=pl.String))
    rows = instances_table(df.lazy(), ["router"]).df.to_dicts()
    assert rows[0]["requests"] == 1.5
    assert rows[0]["busy_fraction"] == pytest.approx(1.0)
    assert rows[0]["mean_e2e_s"] == pytest.approx(3.0)
