"""The engine seam: vLLM's and SGLang's request fields and metric names come from one table (lbbench/engines.py),
and the scrape parser and the request builder read them from there."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lbbench.cli import main
from lbbench.core import Request
from lbbench.engines import SGLANG, VLLM, UnknownEngineError, get_engine
from lbbench.live.http import request_body
from lbbench.live.metrics import parse_metrics

SGLANG_PAGE = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",dp="0"} 3.0
sglang:num_running_reqs{model_name="m",dp="1"} 2.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
sglang:num_queue_reqs{model_name="m",dp="0"} 4.0
# HELP sglang:token_usage The token usage.
sglang:token_usage{model_name="m",dp="0"} 0.25
sglang:token_usage{model_name="m",dp="1"} 0.5
sglang:cached_tokens_total{model_name="m"} 100.0
vllm:num_requests_running{model_name="m"} 99
"""


def test_sglang_metrics_are_read_by_their_own_names():
    m = parse_metrics(SGLANG_PAGE, SGLANG)
    assert (m.num_running, m.num_waiting, m.kv_usage, m.num_preemptions) == (5, 4, 0.5, 0)
    # the vLLM reader sees only the vLLM line of the same page
    v = parse_metrics(SGLANG_PAGE, VLLM)
    assert (v.num_running, v.num_waiting) == (99, 0)
    assert parse_metrics("vllm:num_requests_running 1\n", SGLANG) is None


def test_request_fields_per_engine():
    r = Request(3, 0.0, 10, 7)
    v = request_body(r, "m", engine=VLLM)
    assert (v["max_tokens"], v["min_tokens"], v["ignore_eos"], v["return_token_ids"]) == (7, 7, True, True)
    s = request_body(r, "m", engine=SGLANG)
    assert (s["max_tokens"], s["min_tokens"], s["ignore_eos"]) == (7, 7, True) and "return_token_ids" not in s
    assert request_body(r, "m", engine=SGLANG, priority=2)["priority"] == 2


def test_engine_names():
    assert get_engine(None) is VLLM and get_engine("SGLang") is SGLANG and get_engine(SGLANG) is SGLANG
    with pytest.raises(UnknownEngineError, match="^engine tgi: unknown engine"):
        get_engine("tgi")


def test_engine_flag_needs_endpoints():
    res = CliRunner().invoke(main, ["run", "--engine", "sglang", "--requests", "5"])
    assert res.exit_code == 2 and "--engine: sglang: only for attached endpoints" in res.output
