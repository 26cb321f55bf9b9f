"""One record builder and one time-between-tokens definition for simulated and live records."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from lbbench.core import Request, RequestRecord, tbt_stats

gaps = st.lists(st.floats(min_value=0.0, max_value=5.0, allow_nan=False), min_size=1, max_size=300)


@given(gaps)
def test_tbt_stats_list_and_array_agree(g):
    times = np.concatenate([[10.0], 10.0 + np.cumsum(g)])
    a = tbt_stats(times.tolist())
    b = tbt_stats(times)
    assert np.allclose(a, b)
    mean, p99, mx = a
    assert np.isclose(mean * len(g), times[-1] - times[0])
    assert min(g) - 1e-9 <= p99 <= mx + 1e-9 and np.isclose(mx, max(g))
    assert np.isclose(p99, np.percentile(np.diff(times), 99))


def test_record_builder_copies_the_request_and_computes_tbt():
    req = Request(7, 1.5, 100, 4, task="chat", predicted_output_tokens=5, predicted_bucket=1, session_id=3, turn=1,
                  think_s=2.0)
    rec = RequestRecord.for_request(req, run_id="r", router="jsq", seed=2, instance=1, dispatch_s=1.6,
                                    first_token_s=1.7, finish_s=2.0, generated_tokens=4,
                                    token_times=[1.7, 1.8, 1.9, 2.0], http_status=200)
    assert (rec.request_id, rec.task, rec.arrival_s, rec.prompt_tokens, rec.output_tokens) == (7, "chat", 1.5, 100, 4)
    assert (rec.predicted_output_tokens, rec.predicted_bucket, rec.session_id, rec.turn, rec.think_s) == (5, 1, 3, 1, 2.0)
    assert np.isclose(rec.tbt_mean_s, 0.1) and np.isclose(rec.tbt_max_s, 0.1) and rec.http_status == 200
    lone = RequestRecord.for_request(Request(8, 0.0, 10, 1), run_id="r", router="rr", seed=0, instance=0,
                                     dispatch_s=0.0, first_token_s=0.1, finish_s=0.1, generated_tokens=1)
    assert (lone.tbt_mean_s, lone.think_s) == (None, None)
