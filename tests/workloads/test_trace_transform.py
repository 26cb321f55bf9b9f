"""Trace transforms: window, prompt limit, first N, time scale, target rate."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbbench.workloads import TraceError
from lbbench.workloads.trace_stats import inspect_trace
from lbbench.workloads.trace_transform import parse_window, transform_trace
from lbbench.workloads.traces import CANONICAL_SCHEMA, TraceFrame


def frame(times, prompts=None, outputs=None, failed=None, hashes=None, block_tokens=None) -> TraceFrame:
    n = len(times)
    df = pl.DataFrame({
        "arrival_s": [float(t) for t in times], "prompt_tokens": prompts or [100] * n,
        "output_tokens": outputs or [10] * n, "task": [None] * n, "prefix_hashes": hashes or [None] * n,
        "failed": failed or [False] * n}, schema=CANONICAL_SCHEMA)
    return TraceFrame(df, "t.parquet", "canonical", block_tokens=block_tokens)


def arrivals(tf: TraceFrame) -> list[float]:
    return tf.frame.get_column("arrival_s").to_list()


def test_window_keeps_half_open_interval_and_rezeroes():
    tf = transform_trace(frame([0, 1, 2, 3, 4, 5]), window=(2.0, 4.0))
    assert arrivals(tf) == [0.0, 1.0]


def test_failed_rows_dropped_by_default():
    tf = frame([0, 1, 2], failed=[True, False, False])
    assert len(transform_trace(tf)) == 2
    assert arrivals(transform_trace(tf)) == [0.0, 1.0]
    assert len(transform_trace(tf, drop_failed=False)) == 3


def test_prompt_filter_and_truncate():
    tf = frame([0, 1, 2], prompts=[100, 2000, 600], hashes=[[1], [1, 2, 3, 4], [5, 6]], block_tokens=512)
    assert transform_trace(tf, max_prompt_tokens=1000).frame.get_column("prompt_tokens").to_list() == [100, 600]
    cut = transform_trace(tf, max_prompt_tokens=1000, prompt_overflow="truncate").frame
    assert cut.get_column("prompt_tokens").to_list() == [100, 1000, 600]
    assert cut.get_column("prefix_hashes").to_list() == [[1], [1, 2], [5, 6]]


def test_requests_then_rate():
    tf = transform_trace(frame(range(0, 100, 2)), requests=11, rate=5.0)
    t = arrivals(tf)
    assert len(t) == 11
    assert (len(t) - 1) / t[-1] == pytest.approx(5.0)


def test_subnormal_span_is_same_time():
    with pytest.raises(TraceError, match="same time"):
        transform_trace(frame([0.0, 2.2e-311]), rate=1.0)


def test_time_scale():
    assert arrivals(transform_trace(frame([0, 1, 3]), time_scale=0.5)) == [0.0, 0.5, 1.5]


@settings(max_examples=50, deadline=None)
@given(times=st.lists(st.integers(0, 10**8).map(lambda ms: ms / 1000), min_size=2, max_size=50),
       rate=st.floats(0.01, 1e4))
def test_rate_rescale_is_exact(times, rate):
    times = sorted(times)
    if times[-1] == times[0]:
        with pytest.raises(TraceError, match="same time"):
            transform_trace(frame(times), rate=rate)
        return
    tf = transform_trace(frame(times), rate=rate)
    stats = inspect_trace(tf)
    assert stats["rate_per_s"] == pytest.approx(rate, rel=1e-9)
    t = arrivals(tf)
    assert t[0] == 0.0 and all(a <= b for a, b in zip(t, t[1:]))


@pytest.mark.parametrize("kw, flag", [
    ({"time_scale": 2.0, "rate": 1.0}, "^time_scale: both it and the rate"),
    ({"time_scale": 0.0}, "^time_scale"),
    ({"rate": -1.0}, "^rate_per_s"),
    ({"max_prompt_tokens": 0}, "^max_prompt_tokens"),
    ({"prompt_overflow": "wrap"}, "^prompt_overflow"),
    ({"requests": 0}, "^requests"),
    ({"window": (5.0, 1.0)}, "^window"),
])
def test_bad_transform_names_the_field(kw, flag):
    with pytest.raises(TraceError, match=flag):
        transform_trace(frame([0, 1]), **kw)


def test_parse_window():
    assert parse_window("10:20") == (10.0, 20.0)
    assert parse_window(":20") == (0.0, 20.0)
    assert parse_window("30:") == (30.0, float("inf"))
    for bad in ("10", "a:b", "20:10", "-1:5"):
        with pytest.raises(TraceError, match="^window"):
            parse_window(bad)
