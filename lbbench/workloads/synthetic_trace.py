"""A synthetic workload written out as a canonical trace (``lbbench trace synth``).

The canonical trace (``lbbench.workloads.traces``) replays open loop: every request at its time. An agentic
workload is written as its open-loop rendering (``closed=0``: every call at its planned time, as the Mooncake
tool-agent trace records calls); a closed-loop session workload (``sessions``, ``inference-perf`` with
``user_lock=1``) has no planned times for its later turns and is refused. Prefix hashes and their block size travel
with the trace, so ``lbbench run --trace OUT`` replays the same requests as ``--workload`` did (same arrival times,
lengths, tasks, hashes).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..core import Request
from ..errors import InputError
from .trace_frame import CANONICAL_SCHEMA, TraceFrame
from .traces import write_canonical


def open_loop_spec(workload: str) -> str:
    """The spec whose requests a trace can hold: an agentic spec's open-loop rendering, any other spec as is."""
    if workload.split(":", 1)[0] != "agentic":
        return workload
    name, _, rest = workload.partition(":")
    items = [s for s in rest.split(",") if s.strip() and not s.strip().startswith("closed=")]
    return f"{name}:{','.join(items + ['closed=0'])}"


def requests_frame(requests: list[Request], source: str) -> TraceFrame:
    """Open-loop ``requests`` as a canonical trace frame (refused when some request is a closed-loop turn)."""
    if any(r.session_id is not None for r in requests):
        raise InputError(f"{source} runs closed-loop sessions (a later turn waits for the one before it); a trace "
                         "replays open loop: use an open-loop workload (agentic is written open loop)")
    blocks = {r.prefix_block_tokens for r in requests if r.prefix_hashes}
    if len(blocks) > 1:
        raise InputError(f"{source}: requests name prefix blocks of different sizes ({sorted(blocks)}); a trace "
                         "holds one")
    df = pl.DataFrame({
        "arrival_s": [r.arrival_s for r in requests], "prompt_tokens": [r.prompt_tokens for r in requests],
        "output_tokens": [r.output_tokens for r in requests], "task": [r.task for r in requests],
        "prefix_hashes": [list(r.prefix_hashes) if r.prefix_hashes else None for r in requests],
        "failed": [False] * len(requests)}, schema=CANONICAL_SCHEMA).sort("arrival_s", maintain_order=True)
    return TraceFrame(df, source, "canonical", block_tokens=blocks.pop() if blocks else None)


def write_workload_trace(requests: list[Request], source: str, out: str | Path) -> TraceFrame:
    """Write ``requests`` to ``out`` as a canonical Parquet trace; returns the frame written."""
    tf = requests_frame(requests, source)
    write_canonical(tf, out)
    return tf
