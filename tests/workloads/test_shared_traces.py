"""The public traces kept beside the project match their documented statistics.

The files live in ``../shared/traces`` next to the repository (or the folder in
``LBBENCH_TRACE_DIR``); the tests are skipped when they are not there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lbbench.workloads.trace_stats import inspect_trace
from lbbench.workloads.traces import read_trace, trace_to_requests

TRACE_DIR = Path(os.environ.get("LBBENCH_TRACE_DIR",
                                Path(__file__).resolve().parents[2].parent / "shared" / "traces"))

# (rows, span_s, rate, prompt mean/p50/p90/p99/max/min, output mean/p50/p90/p99/max/min) from SOURCES.md
EXPECTED = {
    "AzureLLMInferenceTrace_conv.csv": ("azure", 19_366, 3501.7, 5.53,
                                        (1154.7, 1020, 2734, 4142, 14050, 2), (211.1, 129, 424, 601, 1000, 7)),
    "synthetic_trace.jsonl": ("mooncake", 3_993, 1022.0, 3.91,
                              (15325.5, 11587, 38611, 66456, 191378, 13), (149.1, 69, 389, 768, 893, 1)),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_statistics_match_sources(name):
    path = TRACE_DIR / name
    if not path.is_file():
        if os.environ.get("CI") or os.environ.get("LBBENCH_REQUIRE_SHARED") == "1":
            pytest.fail(f"shared trace {name} not found at {path}")
        pytest.skip(f"{name} not present")
    fmt, rows, span_s, rate, prompt, output = EXPECTED[name]
    tf = read_trace(path)
    s = inspect_trace(tf)
    assert tf.format == fmt
    assert s["rows"] == rows and s["failed_rows"] == 0 and s["skipped_rows"] == 0
    assert s["span_s"] == pytest.approx(span_s, abs=0.05)
    assert round(s["rate_per_s"], 2) == rate
    for key, want in (("prompt_tokens", prompt), ("output_tokens", output)):
        assert s[f"{key}_mean"] == pytest.approx(want[0], abs=0.05)
        for q, w in zip(("p50", "p90", "p99"), want[1:4]):
            assert s[f"{key}_{q}"] == pytest.approx(w, abs=1.0)  # SOURCES.md rounds to whole tokens
        assert (s[f"{key}_max"], s[f"{key}_min"]) == (want[4], want[5])
    if fmt == "mooncake":
        assert s["prefix_blocks"] == 121_877
        assert round(100 * s["prefix_blocks_repeated_share"], 1) == 64.0
        # len(hash_ids) == ceil(input_length / 512) for every row
        reqs = trace_to_requests(tf)
        assert all(len(r.prefix_hashes) == -(-r.prompt_tokens // 512) for r in reqs)
