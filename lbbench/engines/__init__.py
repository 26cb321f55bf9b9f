"""What lbbench needs to know about a serving engine's OpenAI-compatible dialect, in one place.

Live runs, the proxy, fidelity and profile measurement talk to engines over the same OpenAI API, but each engine
spells its extensions and its Prometheus metrics its own way: the request fields that pin an output length and
report token ids, the gauges a router reads (running and waiting requests, KV-cache usage), the preemption counter,
the prefix-cache counters. An :class:`Engine` holds those names; each engine is a module here (``vllm``, the
default, and ``sglang``), and another engine is one more module registered in ``ENGINES``. The record itself
lives in ``engine.py``, below the engine modules.
"""

from __future__ import annotations

from .engine import Engine, UnknownEngineError
from .sglang import SGLANG
from .vllm import VLLM

ENGINES: dict[str, Engine] = {e.name: e for e in (VLLM, SGLANG)}


def get_engine(name: str | Engine | None) -> Engine:
    """The engine called ``name`` (None: vLLM)."""
    if name is None:
        return VLLM
    if isinstance(name, Engine):
        return name
    try:
        return ENGINES[name.lower()]
    except KeyError:
        raise UnknownEngineError(f"engine {name}: unknown engine (known: {', '.join(ENGINES)})") from None
