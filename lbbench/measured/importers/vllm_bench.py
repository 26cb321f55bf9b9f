"""``vllm bench serve --save-result`` JSON (vllm-project/vllm ``vllm/benchmarks/serve.py`` @ 009e6d4, Apache-2.0).

One JSON object per run; ``--append-result`` appends further objects to the same file, one per line, and each
becomes a stage (in file order) of the experiment named after the file. Keys read:

- setup: ``model_id``, ``request_rate`` (a number, or ``"inf"``: everything sent at once), ``burstiness`` (1.0 is
  Poisson; other values are gamma-distributed gaps, which the schema cannot express), ``max_concurrency`` (a
  client-side cap: the arrivals are then not the offered process, so such runs are refused), ``num_prompts``,
  ``duration``, and any ``--metadata KEY=VALUE`` pair (written at the top level) whose key is a schema column —
  the way to record the GPU, TP, engine limits or ``output_tokens`` with the run;
- results: ``completed``, ``total_input_tokens``, ``total_output_tokens``, ``request_throughput``,
  ``output_throughput``, and per metric ``mean_*_ms``, ``median_*_ms``, ``p<P>_*_ms`` for the percentiles asked
  (``--metric-percentiles``, default 99) of the metrics asked (``--percentile-metrics``, default ttft,tpot,itl;
  e2el only when asked).

**Definitions** (``calculate_metrics``): TTFT and E2EL ("latency") are client-side, from sending the request;
``tpot`` is per request ``(latency - ttft) / (output_len - 1)``, the first token excluded -> ``itl_mean_ms`` (its
mean), ``tpot_p50_ms`` (median) and ``tpot_p99_ms``; vLLM's own ``itl`` is every gap between streamed *chunks*
(several tokens in one chunk make one gap), so it is not used. ``request_throughput`` = completed / duration,
``output_throughput`` = generated tokens / duration; percentiles are numpy's (linear interpolation).

**Derived.** ``prompt_tokens_mean`` = total_input_tokens / completed. The JSON does not record the output length
asked for: unless ``--metadata output_tokens=N`` gave it, ``output_tokens`` is the mean generated per completed
request, rounded (exact when every request ran to its cap, as the ``random`` dataset's default ``ignore_eos``
makes them), with a note.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..model_facts import ModelFacts
from ..schema import BY_NAME, CellError, MeasuredError, MeasuredRowError, check_value, parse_cell
from .common import Imported, RawRow, rounded

RESULT_KEYS = {"request_throughput", "completed", "duration"}


def looks_like(data: Any) -> bool:
    return isinstance(data, dict) and RESULT_KEYS <= set(data) and any(k.startswith("mean_") for k in data)


def load_objects(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``path`` (one, or several appended one per line)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise MeasuredError(f"{path}: not readable ({exc})") from None
    dec = json.JSONDecoder()
    out, i = [], 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError as exc:
            raise MeasuredError(f"{path}: not JSON ({exc})") from None
        out.append(obj)
    return out


def read(path: Path, facts: ModelFacts, context: Mapping[str, Any]) -> Imported:
    path = Path(path)
    objs = load_objects(path)
    if not objs or not all(looks_like(o) for o in objs):
        raise MeasuredError(f"{path}: not a 'vllm bench serve --save-result' file (needs request_throughput, "
                            "completed, duration and mean_*_ms)")
    out = Imported()
    for k, obj in enumerate(objs):
        ident = path.stem
        values: dict[str, Any] = {"id": ident, "stage": k, "source": f"vllm bench serve {path.name}",
                                  "model": obj.get("model_id"), "engine": "vllm"}
        values.update(_metadata(path, obj, k))
        problem = _arrival(obj, values)
        if problem:
            out.problems.append(MeasuredRowError(path, problem, id=values["id"], stage=k, column="arrival"))
            continue
        completed = obj.get("completed") or 0
        values.update({
            "duration_s": rounded(obj.get("duration"), 3), "requests": obj.get("num_prompts"),
            "prompt_tokens_mean": round(obj["total_input_tokens"] / completed, 2)
            if completed and obj.get("total_input_tokens") is not None else None,
            "throughput_rps": rounded(obj.get("request_throughput")),
            "output_tok_s": rounded(obj.get("output_throughput"), 2),
            "itl_mean_ms": rounded(obj.get("mean_tpot_ms"), 3), "tpot_p50_ms": rounded(obj.get("median_tpot_ms"), 3),
            "tpot_p99_ms": rounded(obj.get("p99_tpot_ms"), 3),
            **{f"{col}_{s}_ms": rounded(obj.get(key), 3) for col, metric in (("ttft", "ttft"), ("e2e", "e2el"))
               for s, key in (("mean", f"mean_{metric}_ms"), ("p50", f"median_{metric}_ms"),
                              ("p90", f"p90_{metric}_ms"), ("p99", f"p99_{metric}_ms"))},
        })
        if values.get("output_tokens") is None and completed and obj.get("total_output_tokens"):
            values["output_tokens"] = round(obj["total_output_tokens"] / completed)
            out.notes.append(f"{path.name} run {k}: output_tokens {values['output_tokens']} is the mean generated "
                             "per completed request (the JSON does not record the length asked for)")
        if obj.get("failed"):
            out.notes.append(f"{path.name} run {k}: {obj['failed']} requests failed; the metrics are over the "
                             f"{completed} that completed")
        out.rows.append(RawRow(path, values))
    return out


def _metadata(path: Path, obj: dict, k: int) -> dict[str, Any]:
    """``--metadata`` pairs whose key is a schema column (their values are text)."""
    out: dict[str, Any] = {}
    for key, text in obj.items():
        if key in BY_NAME and key != "stage" and isinstance(text, str):
            try:
                out[key] = check_value(key, parse_cell(key, text))
            except CellError as exc:
                raise MeasuredError(f"{path}: run {k}: metadata {key}: {exc}") from None
    return out


def _arrival(obj: dict, values: dict) -> str | None:
    """Set ``arrival`` and ``rate_rps`` from the run's traffic settings; the problem when it has no arrival kind."""
    if obj.get("max_concurrency") is not None:
        return (f"max_concurrency {obj['max_concurrency']}: a concurrency-capped client does not send the offered "
                "arrival process, which the schema needs")
    if obj.get("ramp_up_strategy"):
        return f"ramp-up {obj['ramp_up_strategy']!r}: a changing rate is not one stage"
    rate = obj.get("request_rate")
    if rate in ("inf", None) or (isinstance(rate, float) and rate == float("inf")):
        values.update(arrival="burst", rate_rps=None)
        return None
    burst = float(obj.get("burstiness", 1.0) or 1.0)
    if burst != 1.0:
        return f"burstiness {burst:g}: gamma-distributed arrivals have no arrival kind in the schema"
    values.update(arrival="poisson", rate_rps=float(rate))
    return None
