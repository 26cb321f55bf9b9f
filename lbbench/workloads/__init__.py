"""Workloads: synthetic request streams and production trace readers.

Every generator returns ``list[lbbench.core.Request]`` sorted by arrival with
ids ``0..n-1`` and is seeded through numpy ``Generator``s.

- ``paper_mix`` — the paper's five-task mix (Table 1), Poisson/bursty arrivals;
- ``paper_classes`` — the paper's Table 2 classes LL/LH/HL/HH in four orders;
- ``poisson`` — fixed or lognormal lengths at a rate;
- ``traces`` — Azure, BurstGPT, Mooncake, canonical and column-mapped traces.
"""

from .arrivals import arrival_times
from .errors import TraceError, WorkloadError
from .paper_classes import PAPER_CLASS_ORDERS, paper_classes
from .paper_mix import PAPER_TASKS, check_paper_mix_fit, paper_mix
from .poisson import parse_length_spec, poisson

__all__ = [
    "PAPER_CLASS_ORDERS", "PAPER_TASKS", "TraceError", "WorkloadError", "arrival_times",
    "check_paper_mix_fit", "paper_classes", "paper_mix", "parse_length_spec", "poisson",
]
