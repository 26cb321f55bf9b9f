"""AIPerf exports (ai-dynamo/aiperf @ db4f639, Apache-2.0) -> one row.

``profile_export_aiperf.json`` (``aiperf/exporters/json_exporter.py``, ``JsonExportData`` in
``aiperf/common/models/export_models.py``) holds one object per metric — ``unit`` plus ``avg``, ``min``, ``max``,
``p1`` ... ``p99``, ``std`` in that unit (``ms``, ``sec``, ``requests/sec``, ``tokens/sec``, ``tokens``,
``requests``) — and ``input_config``, the user's configuration as set (``endpoint.model_names``,
``loadgen.request_rate``, ``loadgen.request_rate_mode``, ``loadgen.concurrency``,
``input.prompt.output_tokens.mean``, ``input.extra`` pairs such as ``ignore_eos``). ``profile_export_aiperf.csv``
(``aiperf/exporters/csv_exporter.py``) holds the same metrics in two sections (``Metric,avg,min,max,p1,...,std``
and ``Metric,Value``, each name followed by its unit in parentheses) but no configuration: its setup columns come
from ``--set``.

**AIPerf's definitions** (``aiperf/metrics/types/``), per request:

- ``time_to_first_token``: first response minus request start -> ``ttft_*``;
- ``request_latency``: last response minus request start -> ``e2e_*``;
- ``inter_token_latency``: ``(request_latency - ttft) / (output_sequence_length - 1)`` ->
  ``itl_mean_ms`` (avg), ``tpot_p50_ms``, ``tpot_p99_ms``;
- ``request_throughput``, ``output_token_throughput``: completed requests and output tokens per second of the
  benchmark -> ``throughput_rps``, ``output_tok_s``; ``benchmark_duration`` -> ``duration_s``; ``request_count``
  -> ``requests``; ``input_sequence_length`` avg / max -> ``prompt_tokens_mean`` / ``_max``.

**Setup.** ``request_rate_mode`` ``constant`` or ``poisson`` (AIPerf's default) at ``request_rate``; a
``concurrency`` setting (a closed loop, or a cap on the rate) has no arrival kind in the schema and is refused.
``output_tokens`` is ``input.prompt.output_tokens.mean`` (noted when its ``stddev`` is not zero), else the mean
output measured, rounded, with a note.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any, Mapping

from ..model_facts import ModelFacts
from ..schema import MeasuredError, MeasuredRowError
from .common import Imported, RawRow, rounded

TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "sec": 1e3, "s": 1e3}
#: CSV metric names -> export tags
HEADERS = {"Time to First Token": "time_to_first_token", "Request Latency": "request_latency",
           "Inter Token Latency": "inter_token_latency", "Request Throughput": "request_throughput",
           "Output Token Throughput": "output_token_throughput", "Request Count": "request_count",
           "Benchmark Duration": "benchmark_duration", "Input Sequence Length": "input_sequence_length",
           "Output Sequence Length": "output_sequence_length"}
ARRIVAL = {"constant": "constant", "poisson": "poisson"}


def looks_like(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("time_to_first_token") or data.get("request_latency"),
                                                 dict) and "unit" in (data.get("request_latency") or {})


def looks_like_csv(text: str) -> bool:
    head = text.lstrip("\ufeff").split("\n", 1)[0]
    return head.startswith("Metric,") and any(h in text for h in HEADERS)


def read_csv_metrics(path: Path, text: str) -> dict[str, dict[str, Any]]:
    """The CSV export as export-JSON metric objects: ``{tag: {"unit": ..., "avg": ..., ...}}``."""
    out: dict[str, dict[str, Any]] = {}
    stats: list[str] = []
    for cells in csv.reader(io.StringIO(text)):
        if not cells or not any(cells):
            continue
        if cells[0] == "Metric":
            stats = ["avg" if s == "Value" else s for s in cells[1:]]
            continue
        m = re.fullmatch(r"(.*?)(?: \((.*)\))?", cells[0].strip())
        tag = HEADERS.get(m.group(1)) if m else None
        if tag is None:
            continue
        obj: dict[str, Any] = {"unit": m.group(2) or ""}
        for s, v in zip(stats, cells[1:]):
            if v.strip():
                try:
                    obj[s] = float(v)
                except ValueError:
                    raise MeasuredError(f"{path}: metric {cells[0]!r}: {s} {v!r} is not a number") from None
        out[tag] = obj
    return out


def read(path: Path, facts: ModelFacts, context: Mapping[str, Any]) -> Imported:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise MeasuredError(f"{path}: not readable ({exc})") from None
    if path.suffix.lower() == ".csv":
        if not looks_like_csv(text):
            raise MeasuredError(f"{path}: not an AIPerf CSV export (first line 'Metric,...')")
        data: dict[str, Any] = read_csv_metrics(path, text)
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise MeasuredError(f"{path}: not JSON ({exc})") from None
        if not looks_like(data):
            raise MeasuredError(f"{path}: not an AIPerf profile export (needs request_latency with a unit)")
    ident = path.parent.name if path.stem.startswith("profile_export") and path.parent.name else path.stem
    out = Imported()
    values: dict[str, Any] = {"id": ident, "stage": 0, "source": f"AIPerf export {path.name}"}
    problem = _setup(data.get("input_config") or {}, values, out.notes, path.name)
    if problem:
        out.problems.append(MeasuredRowError(path, problem, id=ident, stage=0, column="arrival"))
        return out

    def stat(tag: str, key: str, to_ms: bool = False) -> float | None:
        obj = data.get(tag) or {}
        v = obj.get(key)
        if v is None:
            return None
        if to_ms:
            scale = TO_MS.get(str(obj.get("unit", "ms")))
            if scale is None:
                raise MeasuredError(f"{path}: {tag}: unknown time unit {obj.get('unit')!r}")
            return round(float(v) * scale, 3)
        return float(v)

    dur = stat("benchmark_duration", "avg", to_ms=True)
    count = stat("request_count", "avg")
    values.update({
        **{f"ttft_{s}_ms": stat("time_to_first_token", k, True) for s, k in (("mean", "avg"), ("p50", "p50"),
                                                                              ("p90", "p90"), ("p99", "p99"))},
        **{f"e2e_{s}_ms": stat("request_latency", k, True) for s, k in (("mean", "avg"), ("p50", "p50"),
                                                                         ("p90", "p90"), ("p99", "p99"))},
        "itl_mean_ms": stat("inter_token_latency", "avg", True), "tpot_p50_ms": stat("inter_token_latency", "p50", True),
        "tpot_p99_ms": stat("inter_token_latency", "p99", True),
        "throughput_rps": rounded(stat("request_throughput", "avg")),
        "output_tok_s": rounded(stat("output_token_throughput", "avg"), 2),
        "duration_s": None if dur is None else round(dur / 1e3, 3),
        "requests": None if count is None else int(count),
        "prompt_tokens_mean": rounded(stat("input_sequence_length", "avg"), 2),
        "prompt_tokens_max": None if stat("input_sequence_length", "max") is None
        else int(stat("input_sequence_length", "max")),
    })
    if values.get("output_tokens") is None and stat("output_sequence_length", "avg") is not None:
        values["output_tokens"] = round(stat("output_sequence_length", "avg"))
        out.notes.append(f"{path.name}: output_tokens {values['output_tokens']} is the mean output measured (the "
                         "export gives no output length asked for)")
    out.rows.append(RawRow(path, values))
    return out


def _setup(cfg: dict, values: dict, notes: list[str], name: str) -> str | None:
    """Setup columns from ``input_config``; the problem when its load has no arrival kind."""
    endpoint, loadgen = cfg.get("endpoint") or {}, cfg.get("loadgen") or {}
    prompt = ((cfg.get("input") or {}).get("prompt") or {})
    names = endpoint.get("model_names") or []
    if names:
        values["model"] = names[0]
    outs = prompt.get("output_tokens") or {}
    if outs.get("mean"):
        values["output_tokens"] = int(outs["mean"])
        if outs.get("stddev"):
            notes.append(f"{name}: output lengths were drawn around {outs['mean']} (stddev {outs['stddev']}); "
                         "output_tokens is their mean")
    extra = (cfg.get("input") or {}).get("extra") or []
    pairs = extra.items() if isinstance(extra, dict) else (tuple(p) for p in extra if len(p) == 2)
    for key, val in pairs:
        if key == "ignore_eos":
            values["ignore_eos"] = str(val).lower() in ("true", "1")
    if not cfg:
        return None
    if loadgen.get("concurrency") is not None:
        return (f"concurrency {loadgen['concurrency']}: a concurrency-bound load has no arrival kind in the schema "
                "(poisson, constant, burst)")
    if loadgen.get("request_rate") is None:
        return "no request_rate: the load is not an open arrival process"
    mode = str(loadgen.get("request_rate_mode") or "poisson").lower()
    if mode not in ARRIVAL:
        return f"request_rate_mode {mode!r} has no arrival kind in the schema"
    values.update(arrival=ARRIVAL[mode], rate_rps=float(loadgen["request_rate"]))
    return None
