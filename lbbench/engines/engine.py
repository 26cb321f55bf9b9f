"""What an engine spells its own way: the :class:`Engine` record (request fields, Prometheus metric names).

Each engine module (``vllm``, ``sglang``) builds one; ``lbbench.engines`` registers them. This module imports
neither, so the engine modules sit below the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InputError


class UnknownEngineError(InputError):
    """``--engine NAME`` names no known engine."""


@dataclass(frozen=True)
class Engine:
    name: str
    #: gauges summed over label sets (one per served model / data-parallel rank)
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    #: KV-cache usage in 0..1 (the largest over label sets)
    kv_usage: tuple[str, ...]
    #: cumulative preemption counters (empty: the engine has none)
    preemptions: tuple[str, ...] = ()
    #: prefix-cache counters (prompt tokens looked up, and found); None: not exported
    prefix_queries: str | None = None
    prefix_hits: str | None = None
    #: the gauge whose labels carry the KV cache's block count and size (``profile measure``)
    cache_config_info: str | None = None
    #: request fields for an exact output length of N tokens (N substituted for the value ``"N"``)
    exact_length: dict = field(default_factory=lambda: {"max_tokens": "N", "min_tokens": "N", "ignore_eos": True})
    #: request fields that make a streamed chunk say how many tokens it carries
    token_count_fields: dict = field(default_factory=dict)
    #: the per-request priority field of a priority-scheduling server (None: the engine has none)
    priority_field: str | None = "priority"

    def length_fields(self, n: int) -> dict:
        return {k: (n if v == "N" else v) for k, v in self.exact_length.items()}

    @property
    def metric_prefixes(self) -> tuple[str, ...]:
        """Every metric name a scrape reads (a parser looks only at lines starting with one)."""
        return self.running + self.waiting + self.kv_usage + self.preemptions
