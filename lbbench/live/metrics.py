"""Scraping an engine's Prometheus ``/metrics`` into ``MetricsSample`` events.

Only the four gauges/counters a router or a report needs are read: running and
waiting requests, KV-cache usage (0..1) and the cumulative preemption count,
under the names the engine uses (:mod:`lbbench.engines`; vLLM by default).
Label sets (one per served model) are summed; KV usage takes the maximum. The
parser looks only at lines that start with those names, so a scrape of a real
server's few hundred lines costs well under a millisecond.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engines import VLLM, Engine


@dataclass(frozen=True, slots=True)
class ScrapedMetrics:
    num_running: int
    num_waiting: int
    kv_usage: float
    num_preemptions: int


def _value(line: str) -> float:
    # "name{labels} value [timestamp]" or "name value"
    rest = line[line.rindex("}") + 1:] if "}" in line else line.split(None, 1)[1]
    return float(rest.split()[0])


def parse_metrics(text: str, engine: Engine = VLLM) -> ScrapedMetrics | None:
    """Read ``engine``'s gauges from a Prometheus text page; None when none is there."""
    running = waiting = preemptions = 0.0
    kv = 0.0
    seen = False
    prefixes = engine.metric_prefixes
    for line in text.splitlines():
        if not line.startswith(prefixes):
            continue
        name = line.split("{", 1)[0].split(None, 1)[0]
        try:
            v = _value(line)
        except (ValueError, IndexError):
            continue
        seen = True
        if name in engine.running:
            running += v
        elif name in engine.waiting:
            waiting += v
        elif name in engine.preemptions:
            preemptions += v
        elif name in engine.kv_usage:
            kv = max(kv, v)
    if not seen:
        return None
    return ScrapedMetrics(int(running), int(waiting), kv, int(preemptions))
