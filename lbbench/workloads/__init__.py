"""Workloads: synthetic request streams and production trace readers.

Every generator returns ``list[lbbench.core.Request]`` sorted by arrival with
ids ``0..n-1`` and is seeded through numpy ``Generator``s.

- ``paper_mix`` — the paper's five-task mix (Table 1), Poisson/bursty arrivals;
- ``paper_classes`` — the paper's Table 2 classes LL/LH/HL/HH in four orders;
- ``poisson`` — fixed or lognormal lengths at a rate;
- ``traces`` — Azure, BurstGPT, Mooncake, canonical and column-mapped traces
  (``read_trace``, ``transform_trace``, ``inspect_trace``, ``trace_to_requests``,
  ``load_trace_requests``, ``write_canonical``). These import Polars, so they
  are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .arrivals import arrival_times
from .errors import TraceError, WorkloadError
from .paper_classes import PAPER_CLASS_ORDERS, paper_classes
from .paper_mix import PAPER_TASKS, check_paper_mix_fit, paper_mix
from .poisson import parse_length_spec, poisson

_LAZY = {
    "TraceFrame": "traces", "read_trace": "traces", "trace_to_requests": "traces",
    "load_trace_requests": "traces", "write_canonical": "traces",
    "transform_trace": "trace_transform", "inspect_trace": "trace_stats",
    "TraceMapping": "trace_formats", "parse_mapping": "trace_formats",
}

__all__ = [
    "PAPER_CLASS_ORDERS", "PAPER_TASKS", "TraceError", "WorkloadError", "arrival_times",
    "check_paper_mix_fit", "paper_classes", "paper_mix", "parse_length_spec", "poisson", *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
