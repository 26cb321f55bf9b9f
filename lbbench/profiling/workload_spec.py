"""One workload named in one argument: ``trace:FILE[?K=V&...]`` or ``workload:NAME[?K=V&...]``.

``lbbench fidelity --calibrate-on SPEC --check-on SPEC`` names two workloads on one command line, so each carries
its own settings after ``?`` (URL-query style), and what it leaves out comes from the command's flags
(``--requests``, ``--rate``, ``--prompt-tokens``, ...):

- ``trace:traces/conv.csv?max_prompt_tokens=1000&requests=150&rate=1.5``
- ``trace:mooncake.jsonl?max_prompt_tokens=1000&prompt_overflow=filter``
- ``workload:poisson?prompt_tokens=256:0.5&output_tokens=64:0.5&seed=3``

Keys: ``requests``, ``rate``, ``seed`` for both kinds; a trace's read and transform options (``max_prompt_tokens``,
``prompt_overflow``, ``time_scale``, ``window`` as ``START:END`` seconds, ``trace_format``); a synthetic workload's
``prompt_tokens``, ``output_tokens`` and ``burstiness``. A bad spec is an :class:`~lbbench.errors.InputError`
naming the field (``calibrate_on`` / ``check_on``) that carried it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..workloads.trace_transform import parse_window

KINDS = ("trace", "workload")
COMMON_KEYS = {"requests": int, "rate": float, "seed": int}
TRACE_KEYS = {"max_prompt_tokens": int, "prompt_overflow": str, "time_scale": float, "window": str,
              "trace_format": str}
WORKLOAD_KEYS = {"prompt_tokens": str, "output_tokens": str, "burstiness": float}
SYNTAX = "give trace:FILE[?K=V&...] or workload:NAME[?K=V&...]"


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str
    """``trace`` or ``workload``."""
    value: str
    """The trace file, or the workload name (``poisson``, ``paper-mix``, ``dataset:FILE``, ...)."""
    options: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    """As the user gave it (the report's column label)."""

    @property
    def label(self) -> str:
        return self.text or f"{self.kind}:{self.value}"

    def run_config_fields(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """``RunConfig`` keyword arguments: this spec's options over ``defaults`` (``requests``, ``rate_per_s``,
        ``seed``, ``prompt_tokens``, ``output_tokens``; a trace's options go to ``trace_options``)."""
        opts = dict(self.options)
        out = dict(defaults)
        for key, target in (("requests", "requests"), ("rate", "rate_per_s"), ("seed", "seed")):
            if key in opts:
                out[target] = opts.pop(key)
        if self.kind == "trace":
            out["trace"] = self.value
            out["trace_options"] = {**out.get("trace_options", {}), **opts}
        else:
            out["workload"] = self.value
            out["trace"] = None
            out["trace_options"] = {}
            out.update(opts)
        return out


def _cast(key: str, raw: str, typ: type, field_name: str, text: str) -> Any:
    try:
        value = typ(raw)
    except ValueError:
        raise InputError(f"{text!r}: {key}={raw!r} is not {'an integer' if typ is int else 'a number'}",
                         field_name) from None
    if key in ("requests", "max_prompt_tokens") and value < 1:
        raise InputError(f"{text!r}: {key} must be >= 1", field_name)
    if key in ("rate", "time_scale", "burstiness") and not value > 0:
        raise InputError(f"{text!r}: {key} must be > 0", field_name)
    if key == "window":
        try:
            return parse_window(value)
        except ValueError as exc:
            raise InputError(f"{text!r}: {exc}", field_name) from None
    return value


def parse_workload_spec(text: str, field_name: str = "workload") -> WorkloadSpec:
    """Parse one spec; :class:`InputError` (field ``field_name``) naming what is wrong."""
    kind, sep, rest = text.partition(":")
    if not sep or kind not in KINDS:
        raise InputError(f"{text!r}: {SYNTAX}", field_name)
    value, _, query = rest.partition("?")
    if not value:
        raise InputError(f"{text!r}: no {'file' if kind == 'trace' else 'workload name'} after {kind}:", field_name)
    allowed = {**COMMON_KEYS, **(TRACE_KEYS if kind == "trace" else WORKLOAD_KEYS)}
    options: dict[str, Any] = {}
    for item in query.split("&") if query else []:
        key, eq, raw = item.partition("=")
        if not eq or not key or not raw:
            raise InputError(f"{text!r}: expected K=V after ?, got {item!r}", field_name)
        if key not in allowed:
            raise InputError(f"{text!r}: unknown option {key!r} for a {kind} (choose from "
                             f"{', '.join(sorted(allowed))})", field_name)
        if key in options:
            raise InputError(f"{text!r}: {key} given twice", field_name)
        options[key] = _cast(key, raw, allowed[key], field_name, text)
    if kind == "trace" and not Path(value).is_file():
        raise InputError(f"{text!r}: trace file {value} not found", field_name)
    return WorkloadSpec(kind, value, options, text)
