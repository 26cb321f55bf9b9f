"""Where a long run's memory goes: a ``tracemalloc`` diff between a baseline after warm-up and the end.

Off unless the environment sets ``LBBENCH_TRACEMALLOC`` to a file path. Then the process (the proxy, the replay
driver, each load worker) starts tracing, takes a baseline snapshot ``LBBENCH_TRACEMALLOC_WARMUP`` seconds in
(default 30) and, when it stops, writes the allocation sites that grew most since the baseline to that path
(suffixed with the process's role). Tracing slows the process down: use it on short runs at modest rates.
"""

from __future__ import annotations

import os
import time
import tracemalloc

ENV = "LBBENCH_TRACEMALLOC"
ENV_WARMUP = "LBBENCH_TRACEMALLOC_WARMUP"


class MemTrace:
    """``start()`` at startup, ``tick()`` now and then (takes the baseline once warm), ``dump()`` at the end."""

    def __init__(self, role: str, path: str | None = None, warmup_s: float | None = None, frames: int = 4):
        self.path = path if path is not None else os.environ.get(ENV)
        self.role = role
        self.warmup_s = float(os.environ.get(ENV_WARMUP, "30")) if warmup_s is None else warmup_s
        self.frames = frames
        self.baseline: tracemalloc.Snapshot | None = None
        self.t_start = 0.0
        self.t_base = 0.0

    @property
    def on(self) -> bool:
        return bool(self.path)

    def start(self) -> None:
        if self.on and not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)
        self.t_start = time.monotonic()

    def tick(self) -> None:
        if self.on and self.baseline is None and time.monotonic() - self.t_start >= self.warmup_s:
            self.baseline = tracemalloc.take_snapshot()
            self.t_base = time.monotonic()

    def dump(self, top: int = 25) -> str | None:
        """Write the top growth sites (by line, and by traceback for the first few); returns the file written."""
        if not self.on or not tracemalloc.is_tracing():
            return None
        end = tracemalloc.take_snapshot()
        base = self.baseline
        flt = [tracemalloc.Filter(False, tracemalloc.__file__),
               tracemalloc.Filter(False, "<frozen importlib._bootstrap>")]
        end = end.filter_traces(flt)
        since = "a baseline" if base else "start (no baseline: run shorter than the warm-up)"
        span_s = time.monotonic() - (self.t_base or self.t_start)
        lines = [f"# {self.role}: tracemalloc growth over {span_s:.0f} s after {since}"]
        if base is None:
            stats = end.statistics("lineno")[:top]
            lines += [str(s) for s in stats]
        else:
            base = base.filter_traces(flt)
            total = sum(s.size_diff for s in end.compare_to(base, "filename"))
            lines.append(f"# total growth {total / 2**20:+.1f} MiB")
            for s in end.compare_to(base, "lineno")[:top]:
                lines.append(f"{s.size_diff / 2**10:+10.1f} KiB {s.count_diff:+8d} blocks  {s.traceback[0]}")
            lines.append("# by traceback (top 5)")
            for s in end.compare_to(base, "traceback")[:5]:
                lines.append(f"{s.size_diff / 2**10:+10.1f} KiB {s.count_diff:+8d} blocks")
                lines += [f"      {f}" for f in s.traceback.format()]
        path = f"{self.path}.{self.role}"
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        return path
