"""inference-perf experiment folders (kubernetes-sigs/inference-perf, Apache-2.0) -> one row per load stage.

A folder holds inference-perf's resolved configuration and its per-stage reports, as inference-sim's campaigns keep
them (``inference-sim/training`` @ ed5c1d2 ``default_args/<exp>/``)::

    exp-config.yaml                      the vLLM server's flags (model, tensor_parallelism, engine limits)
    profile.yaml                         the workload asked for (JSON), optional
    results/config.yaml                  inference-perf's resolved config: what actually ran
    results/stage_N_lifecycle_metrics.json

(a folder with ``config.yaml`` and the stage files directly in it is read too), or a folder of such folders.

**Metric definitions** (inference-perf ``inference_perf/reportgen/base.py`` ``summarize_requests``, at the
version these folders were written with; every figure in seconds, converted to ms here):

- ``time_to_first_token``: first streamed timestamp minus the request's start -> ``ttft_*``;
- ``request_latency``: end minus start of the request -> ``e2e_*``;
- ``time_per_output_token`` (TPOT): per request, (last timestamp - first) / (number of timestamps - 1);
  ``inter_token_latency``: every gap between consecutive timestamps;
- ``throughput.requests_per_sec``: completed requests / (last end - first start) -> ``throughput_rps``;
  ``throughput.output_tokens_per_sec``: output tokens counted by *re-tokenizing the returned text* (not the
  tokens generated) over the same span.

**The timestamps were lines, not tokens.** Until kubernetes-sigs/inference-perf@3631096 (2025-11-14, "stabilize
streaming responses ... using iter_any()") the completions client appended a timestamp for every *line* of the
SSE stream (``async for chunk_bytes in response.content``), the blank line that ends each ``data:`` event
included. A stream of ``n`` tokens then yields ``2 (n + 1)`` timestamps (the ``[DONE]`` event counts too), half of
the inter-token gaps are the microseconds between an event and its blank line, and TPOT is
``(E2E - TTFT) / (2n + 1)``: about **half** the time per token. The folders shipped here were written by such a
version: their ``results/config.yaml`` has no ``enable_multi_turn_chat`` (added 2025-11-24, @4ec6bfd), and
``(E2E - TTFT) / TPOT`` is ``2n + 1`` to within 0.11 % on every stage (495 for the 247-token codegen stages). That is
why the training summaries give Llama-2-7B FP16 on an H100 a mean TPOT of 3.6 ms, below the ~3.9 ms one read of
its 13.2 GB of weights takes. The importer tells the two timings apart from the data — ``(E2E - TTFT) / TPOT``
near ``2n + 1`` (lines) or ``n - 1`` (tokens), ``n`` the tokens each request generated — and rescales a line-timed
TPOT by ``(2n + 1) / (n - 1)`` (each request's TPOT is a fixed multiple of its true one, so the mean and the
percentiles scale alike); when it can tell neither, the ITL and TPOT cells stay empty, with a note.

**Output tokens.** With ``ignore_eos`` every request generates exactly ``output_len`` tokens, but the re-tokenized
text counts fewer (a base model on random-token prompts emits end-of-sequence tokens that the detokenizer drops:
Llama-2-7B's codegen stage averages 193.7 of 247). So with ``ignore_eos``, ``n = output_len`` and
``output_tok_s = throughput_rps x output_len``; without it, inference-perf's counts are kept.

**Workload.** ``results/config.yaml`` is what ran; ``profile.yaml`` is what was asked. The shipped folders'
profiles ask for e.g. 11 groups x 4 users with multi-turn chat, but the inference-perf that ran predates those
keys (``num_unique_system_prompts``, ``num_users_per_system_prompt``, ``enable_multi_turn_chat``), ignored them and
ran its defaults, 10 groups x 10 prompts, single-turn: the rows follow ``config.yaml`` (a missing
``enable_multi_turn_chat`` is single-turn) and a note says where the two differ.

**Setup.** ``model``, ``tp`` and the engine limits come from ``exp-config.yaml``; ``replicas`` is its
``data_parallelism`` (absent: vLLM's default, 1); ``engine`` is inference-perf's ``server.type``; the weight dtype
follows the model's config (``lbbench.measured.model_facts``). The GPU, the engine version, prefix caching, the KV
dtype and CPU offload are not in these files: give them with ``--set``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..model_facts import ModelFacts
from ..schema import MeasuredError, MeasuredRowError
from .common import Imported, RawRow, first, ms, rounded

ARRIVAL = {"constant": "constant", "poisson": "poisson"}
_STAGE_FILE = re.compile(r"stage_(\d+)_lifecycle_metrics\.json$")
#: how close (E2E - TTFT) / TPOT must be to 2n + 1 (line timestamps) or n - 1 (token timestamps)
TIMING_TOLERANCE = 0.05


def _results_dir(d: Path) -> Path | None:
    for r in (d / "results", d):
        if (r / "config.yaml").is_file() and any(_STAGE_FILE.search(p.name) for p in r.glob("stage_*.json")):
            return r
    return None


def is_experiment(path: Path) -> bool:
    return path.is_dir() and _results_dir(path) is not None


def read(path: Path, facts: ModelFacts, context: Mapping[str, Any]) -> Imported:
    """Rows of one experiment folder, or of every experiment folder directly inside ``path``."""
    path = Path(path)
    if is_experiment(path):
        return _experiment(path, facts)
    subs = sorted(d for d in path.iterdir() if is_experiment(d)) if path.is_dir() else []
    if not subs:
        raise MeasuredError(f"{path}: no inference-perf experiment here (a folder with results/config.yaml and "
                            "results/stage_N_lifecycle_metrics.json)")
    out = Imported()
    for d in subs:
        out.extend(_experiment(d, facts))
    return out


def _load(path: Path, parse: Any) -> Any:
    try:
        return parse(path.read_text())
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise MeasuredError(f"{path}: not readable ({str(exc).splitlines()[0]})") from None


def _mapping(path: Path, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise MeasuredError(f"{path}: expected a mapping at the top")
    return data


def line_timing_factor(e2e_s: float, ttft_s: float, tpot_s: float, n: float) -> float | None:
    """What a reported TPOT is multiplied by to give the time per token: 1 when it was timed per token,
    ``(2n + 1) / (n - 1)`` when per SSE line (module docstring), None when it is neither."""
    if not tpot_s or n is None or n < 2:
        return None
    gaps = (e2e_s - ttft_s) / tpot_s
    if abs(gaps - (2 * n + 1)) <= TIMING_TOLERANCE * (2 * n + 1):
        return (2 * n + 1) / (n - 1)
    if abs(gaps - (n - 1)) <= TIMING_TOLERANCE * (n - 1):
        return 1.0
    return None


def _workload(d: Path, cfg: dict, prof: dict, out: Imported) -> dict[str, Any]:
    data = cfg.get("data") or {}
    values: dict[str, Any] = {}
    if data.get("type") == "shared_prefix":
        sp = data.get("shared_prefix") or {}
        values = {"prefix_groups": first(sp, "num_groups", "num_unique_system_prompts"),
                  "prompts_per_group": first(sp, "num_prompts_per_group", "num_users_per_system_prompt"),
                  "system_prompt_tokens": sp.get("system_prompt_len"), "question_tokens": sp.get("question_len"),
                  "output_tokens": sp.get("output_len"), "multi_turn": bool(sp.get("enable_multi_turn_chat"))}
        asked = ((prof.get("data") or {}).get("shared_prefix") or {}) if prof else {}
        want = (first(asked, "num_unique_system_prompts", "num_groups"),
                first(asked, "num_users_per_system_prompt", "num_prompts_per_group"),
                bool(asked.get("enable_multi_turn_chat")))
        have = (values["prefix_groups"], values["prompts_per_group"], values["multi_turn"])
        if asked and want != have:
            why = (" (its config.yaml has no enable_multi_turn_chat: the version predates the option, "
                   "kubernetes-sigs/inference-perf@4ec6bfd, and ignored the profile's keys)"
                   if "enable_multi_turn_chat" not in sp else "")
            out.notes.append(f"{d.name}: profile.yaml asks for {want[0]} groups x {want[1]} users"
                             f"{', multi-turn' if want[2] else ''}; inference-perf ran {have[0]} x {have[1]}"
                             f"{', multi-turn' if have[2] else ', single-turn'}{why}; the rows follow config.yaml")
    else:
        dist = data.get("output_distribution") or {}
        if dist.get("max") is not None:
            values["output_tokens"] = int(dist["max"])
            out.notes.append(f"{d.name}: output_tokens is the output distribution's max ({dist['max']}), the cap "
                             "each request asked for")
    return values


def _experiment(d: Path, facts: ModelFacts) -> Imported:
    out = Imported()
    res = _results_dir(d)
    assert res is not None
    cfg = _mapping(res / "config.yaml", _load(res / "config.yaml", yaml.safe_load))
    exp = _mapping(d / "exp-config.yaml", _load(d / "exp-config.yaml", yaml.safe_load)) \
        if (d / "exp-config.yaml").is_file() else {}
    prof = _mapping(d / "profile.yaml", _load(d / "profile.yaml", yaml.safe_load)) \
        if (d / "profile.yaml").is_file() else {}
    server, load = cfg.get("server") or {}, cfg.get("load") or {}
    model = exp.get("model") or server.get("model_name")
    common: dict[str, Any] = {
        "id": d.name, "source": f"inference-perf experiment {d.name}", "model": model,
        "tp": exp.get("tensor_parallelism"), "replicas": exp.get("data_parallelism", 1) if exp else None,
        "engine": server.get("type"), "max_num_seqs": exp.get("max_num_seqs"),
        "max_num_batched_tokens": exp.get("max_num_batched_tokens"), "max_model_len": exp.get("max_model_len"),
        "weights_dtype": facts.weights_dtype(model) if model else None, "ignore_eos": server.get("ignore_eos"),
        **_workload(d, cfg, prof, out),
    }
    stages = load.get("stages") or []
    files = sorted(((int(m.group(1)), p) for p in res.glob("stage_*_lifecycle_metrics.json")
                    if (m := _STAGE_FILE.search(p.name))), key=lambda kp: kp[0])
    for k, p in files:
        values = {**common, "stage": k}
        arrival = ARRIVAL.get(str(load.get("type")))
        if arrival is None:
            out.problems.append(MeasuredRowError(p, f"load type {load.get('type')!r} has no arrival kind in the "
                                                    "schema (poisson, constant, burst)", id=d.name, stage=k,
                                                 column="arrival"))
            continue
        values["arrival"] = arrival
        st = stages[k] if k < len(stages) and isinstance(stages[k], dict) else {}
        values.update(_stage(p, _mapping(p, _load(p, json.loads)), values, st, out))
        out.rows.append(RawRow(p, values))
    return out


def _stage(p: Path, m: dict, values: dict, st: dict, out: Imported) -> dict[str, Any]:
    ls, succ = m.get("load_summary") or {}, m.get("successes") or {}
    lat = succ.get("latency") or {}
    ttft, e2e = lat.get("time_to_first_token") or {}, lat.get("request_latency") or {}
    tpot = lat.get("time_per_output_token") or {}
    prompt, thr = succ.get("prompt_len") or {}, succ.get("throughput") or {}
    name = f"{values['id']} stage {values['stage']}"
    row: dict[str, Any] = {
        "rate_rps": first(st, "rate") or ls.get("requested_rate"), "duration_s": st.get("duration"),
        "requests": ls.get("count"), "prompt_tokens_mean": rounded(prompt.get("mean"), 2),
        "prompt_tokens_max": int(prompt["max"]) if prompt.get("max") is not None else None,
        **{f"ttft_{s}_ms": ms(ttft.get(k)) for s, k in (("mean", "mean"), ("p50", "median"), ("p90", "p90"),
                                                         ("p99", "p99"))},
        **{f"e2e_{s}_ms": ms(e2e.get(k)) for s, k in (("mean", "mean"), ("p50", "median"), ("p90", "p90"),
                                                       ("p99", "p99"))},
        "throughput_rps": rounded(thr.get("requests_per_sec")),
    }
    out_len = (succ.get("output_len") or {}).get("mean")
    n = values.get("output_tokens") if values.get("ignore_eos") else out_len
    factor = None
    if tpot.get("mean") and e2e.get("mean") is not None and ttft.get("mean") is not None:
        factor = line_timing_factor(e2e["mean"], ttft["mean"], tpot["mean"], n)
    if factor is None:
        if tpot:
            out.notes.append(f"{name}: (E2E - TTFT) / TPOT is neither 2n + 1 nor n - 1 for n = {n}: cannot tell how "
                             "TPOT was timed, ITL and TPOT left empty")
    else:
        if factor != 1.0:
            out.notes.append(f"{name}: TPOT timed per SSE line (inference-perf before @3631096): ITL and TPOT "
                             f"rescaled by (2n + 1) / (n - 1) = {factor:.4f} for n = {n:g} tokens")
        row.update({col: ms(tpot[k] * factor) for col, k in (("itl_mean_ms", "mean"), ("tpot_p50_ms", "median"),
                                                              ("tpot_p99_ms", "p99")) if tpot.get(k) is not None})
    reported = thr.get("output_tokens_per_sec")
    if values.get("ignore_eos") and values.get("output_tokens") and row["throughput_rps"] is not None:
        row["output_tok_s"] = round(row["throughput_rps"] * values["output_tokens"], 2)
        if reported is not None and abs(reported - row["output_tok_s"]) > 0.02 * row["output_tok_s"]:
            per = f" ({out_len:.1f} tokens a request)" if out_len is not None else ""
            out.notes.append(f"{name}: output_tok_s {row['output_tok_s']:g} = throughput x {values['output_tokens']} "
                             f"tokens (ignore_eos); inference-perf's {reported:.1f} counts the re-tokenized text{per}")
    else:
        row["output_tok_s"] = rounded(reported, 2)
    failed = (m.get("failures") or {}).get("count") or 0
    if failed:
        out.notes.append(f"{name}: {failed} of {ls.get('count')} requests failed; latencies and throughput are over "
                         f"the {succ.get('count')} that completed")
    return row
