"""GuideLLM benchmark reports (vllm-project/guidellm, Apache-2.0; report schema version 2 as of v0.7.3 @ 3938355)
-> one row per benchmark (each is a stage of the experiment named after the file).

``guidellm benchmark --output-path benchmarks.json`` writes a ``GenerativeBenchmarksReport``
(``src/guidellm/benchmark/schemas/report.py``): ``config.spec`` (the arguments: ``backend.model``, ``data``) and
``benchmarks``, each with ``config.strategy`` (``type_`` and ``rate``), ``scheduler_metrics`` and ``metrics``, a
``StatusDistributionSummary`` per metric whose ``successful`` part is read (``mean``, ``percentiles.p50/p90/p99``,
``max``; ``src/guidellm/schemas/statistics.py``).

**GuideLLM's definitions** (``src/guidellm/schemas/request_stats.py``), per request:

- ``time_to_first_token_ms``: first token minus request start -> ``ttft_*``;
- ``request_latency`` (**seconds**): end minus start -> ``e2e_*``;
- ``inter_token_latency_ms``: ``(last token - first token) / (output tokens - 1)``, the first token excluded ->
  ``itl_mean_ms``, ``tpot_p50_ms``, ``tpot_p99_ms``;
- ``time_per_output_token_ms`` is ``(last token - start) / output tokens``, the TTFT *included*: not the schema's
  TPOT, so it is not used;
- ``requests_per_second`` and ``output_tokens_per_second``: rates over the benchmark; their mean ->
  ``throughput_rps``, ``output_tok_s``.

**Setup.** ``constant`` and ``poisson`` strategies map to those arrivals at their ``rate``; ``synchronous``,
``concurrent`` and ``throughput`` are closed loops (the next request waits for a free slot), and a ``max_concurrency``
cap on an open strategy distorts its arrivals: those benchmarks are refused. ``output_tokens`` is the synthetic
data's ``output_tokens`` when the spec gives it, else the largest output measured (a note says so).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..model_facts import ModelFacts
from ..schema import MeasuredError, MeasuredRowError
from .common import Imported, RawRow, rounded

ARRIVAL = {"constant": "constant", "poisson": "poisson"}


def looks_like(data: Any) -> bool:
    return (isinstance(data, dict) and isinstance(data.get("benchmarks"), list)
            and all(isinstance(b, dict) and "time_to_first_token_ms" in (b.get("metrics") or {})
                    for b in data["benchmarks"]) and bool(data["benchmarks"]))


def _ok(metric: Any) -> dict[str, Any]:
    """The ``successful`` distribution of a status summary (empty when absent)."""
    return (metric or {}).get("successful") or {} if isinstance(metric, dict) else {}


def _dist(metric: Any, scale: float = 1.0) -> dict[str, float | None]:
    ok = _ok(metric)
    pct = ok.get("percentiles") or {}
    return {"mean": rounded(ok["mean"] * scale, 3) if ok.get("mean") is not None else None,
            **{p: rounded(pct[p] * scale, 3) if pct.get(p) is not None else None for p in ("p50", "p90", "p99")}}


def read(path: Path, facts: ModelFacts, context: Mapping[str, Any]) -> Imported:
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise MeasuredError(f"{path}: not a readable JSON report ({exc})") from None
    if not looks_like(report):
        raise MeasuredError(f"{path}: not a GuideLLM benchmarks report (needs benchmarks[].metrics)")
    spec = ((report.get("config") or {}).get("spec") or {})
    model = (spec.get("backend") or {}).get("model") or None
    data = spec.get("data") or []
    asked_out = next((d.get("output_tokens") for d in data if isinstance(d, dict) and d.get("output_tokens")), None)
    out = Imported()
    for k, bench in enumerate(report["benchmarks"]):
        strategy = (bench.get("config") or {}).get("strategy") or {}
        kind = strategy.get("type_") or strategy.get("type")
        values: dict[str, Any] = {"id": path.stem, "stage": k, "source": f"GuideLLM report {path.name}",
                                  "model": model}
        if kind not in ARRIVAL or strategy.get("max_concurrency") is not None:
            why = (f"strategy {kind!r} is a closed loop (a request waits for a free slot)" if kind not in ARRIVAL
                   else f"max_concurrency {strategy['max_concurrency']} caps the {kind} arrivals")
            out.problems.append(MeasuredRowError(path, f"{why}: no arrival kind of the schema", id=path.stem,
                                                 stage=k, column="arrival"))
            continue
        m = bench.get("metrics") or {}
        sched = bench.get("scheduler_metrics") or {}
        ttft, e2e, itl = (_dist(m.get("time_to_first_token_ms")), _dist(m.get("request_latency"), 1e3),
                          _dist(m.get("inter_token_latency_ms")))
        prompt, outs = _ok(m.get("prompt_token_count")), _ok(m.get("output_token_count"))
        duration = bench.get("duration")
        if duration is None and sched.get("measure_end_time") is not None:
            duration = sched["measure_end_time"] - sched.get("measure_start_time", 0.0)
        values.update({
            "arrival": ARRIVAL[kind], "rate_rps": strategy.get("rate"), "duration_s": rounded(duration, 3),
            "requests": ((m.get("request_totals") or sched.get("requests_made") or {}).get("total")),
            "prompt_tokens_mean": rounded(prompt.get("mean"), 2),
            "prompt_tokens_max": int(prompt["max"]) if prompt.get("max") is not None else None,
            "output_tokens": asked_out,
            **{f"ttft_{s}_ms": ttft[s] for s in ("mean", "p50", "p90", "p99")},
            **{f"e2e_{s}_ms": e2e[s] for s in ("mean", "p50", "p90", "p99")},
            "itl_mean_ms": itl["mean"], "tpot_p50_ms": itl["p50"], "tpot_p99_ms": itl["p99"],
            "throughput_rps": rounded(_ok(m.get("requests_per_second")).get("mean")),
            "output_tok_s": rounded(_ok(m.get("output_tokens_per_second")).get("mean"), 2),
        })
        if asked_out is None and outs.get("max") is not None:
            values["output_tokens"] = int(outs["max"])
            out.notes.append(f"{path.name} benchmark {k}: output_tokens {values['output_tokens']} is the longest "
                             "output measured (the report's data spec gives no output length)")
        out.rows.append(RawRow(path, values))
    return out
