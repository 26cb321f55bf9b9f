"""MLPerf Inference loadgen logs (mlcommons/inference ``loadgen/``, Apache-2.0) -> one row per scenario folder.

A scenario folder holds ``mlperf_log_detail.txt`` (``:::MLLOG {json}`` lines; read first) and/or
``mlperf_log_summary.txt``, ``mlperf.conf`` and ``user.conf``; ``system.json`` and the harness README (with the
``vllm serve`` command) sit in it or up to two folders above, as in a results tree.

**Loadgen's definitions** (mlcommons/inference @ da26cb1 ``loadgen/loadgen.cc``, ``logging.cc``, ``results.cc``):

- a sample's latency runs from its *scheduled* time (the Poisson schedule in Server) to its completion, so it
  includes any delay in issuing it -> ``e2e_*``; its first-token latency likewise -> ``ttft_*``;
- "time per output token" of a sample is ``(latency - first token latency) / (n_tokens - 1)``, the first token
  excluded, ``n_tokens`` as the system under test reports it -> ``tpot_*``; the "Mean Time to Output Token" is its
  mean over samples -> ``itl_mean_ms``;
- percentiles are nearest-rank (``sorted[floor(count x p)]``, no interpolation), means are integer nanoseconds;
- Server: "Completed samples per second" is ``(samples - 1) / (the last completion's time)`` -> ``throughput_rps``,
  "Scheduled samples per second" is ``(samples - 1) / (the last sample's scheduled time)`` -> ``rate_rps`` (the
  offered Poisson rate as realised; the target is ``target_qps``), "Completed tokens per second" -> ``output_tok_s``;
  ``generated_query_duration`` -> ``duration_s``;
- Offline: every sample is issued at once (``arrival = burst``); ``duration_s`` is the longest latency (the time to
  finish them all), ``throughput_rps`` and ``output_tok_s`` are "Samples per second" and "Tokens per second"; when
  even the shortest latency exceeds half the longest, the harness reported the samples together at the end (the
  shipped Red Hat run: 887.1-888.6 s) and the latencies say nothing of each sample, so E2E is left empty.

**Setup.** The benchmark is identified from ``mlperf.conf`` (the one whose performance sample count, token-latency
setting and Server TTFT/TPOT limits match the log); a benchmark in :data:`BENCHMARKS` gives the model, the output
cap and whether EOS ends generation, from its reference implementation. ``system.json`` gives the GPU, the engine
and its version, and the replicas (accelerators / TP). The harness README's launch command for the scenario and GPU
(``vllm serve ...`` for Server, the SUT's engine arguments for Offline) gives the engine limits; being the whole
command, a flag it lacks means vLLM's default: TP 1, KV cache dtype ``auto``, no CPU KV offload, and prefix caching
on (vLLM's V1 engine, the default from 0.8.0, enables it unless ``--no-enable-prefix-caching``). The weight dtype
(a closed-division submitter may quantize) and the prompt lengths (not public) are not in these files: ``--set``.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..model_facts import ModelFacts
from ..schema import KV_DTYPES, MeasuredError, MeasuredRowError
from .common import Imported, RawRow, ns_to_ms, rounded

DETAIL, SUMMARY = "mlperf_log_detail.txt", "mlperf_log_summary.txt"


@dataclass(frozen=True)
class Benchmark:
    model: str
    output_tokens: int
    ignore_eos: bool
    source: str


_LLAMA31_8B = Benchmark("meta-llama/Llama-3.1-8B-Instruct", 128, False,
                        "mlcommons/inference language/llama3.1-8b: README (the model), SUT_VLLM.py @d8764c4 "
                        "(max_tokens 128, min_tokens 1, generation ends at EOS)")
#: benchmarks whose reference implementation was read: model, output cap, EOS honoured
BENCHMARKS: dict[str, Benchmark] = {"llama3_1-8b": _LLAMA31_8B, "llama3_1-8b-interactive": _LLAMA31_8B,
                                    "llama3_1-8b-edge": _LLAMA31_8B}
#: accelerator names in system.json -> lbbench GPU names (the unambiguous ones)
GPU_NAMES = ((r"H100.*(SXM|HBM3)", "h100"), (r"H200", "h200"), (r"A100.*80", "a100-80gb"), (r"A100.*40", "a100-40gb"),
             (r"L40S", "l40s"), (r"\bL4\b", "l4"), (r"MI300X", "mi300x"))
GPU_TOKENS = ("H100", "H200", "A100", "L40S", "L4", "MI300X", "B200", "GB200")
#: vLLM flags -> columns
FLAGS = {"max-model-len": "max_model_len", "max-num-seqs": "max_num_seqs",
         "max-num-batched-tokens": "max_num_batched_tokens", "gpu-memory-utilization": "gpu_memory_utilization",
         "long-prefill-token-threshold": "long_prefill_token_threshold", "tensor-parallel-size": "tp", "tp": "tp"}
_INT_FLAGS = {"max_model_len", "max_num_seqs", "max_num_batched_tokens", "long_prefill_token_threshold", "tp"}


def is_scenario(path: Path) -> bool:
    return path.is_dir() and ((path / DETAIL).is_file() or (path / SUMMARY).is_file())


def read_detail(path: Path) -> dict[str, Any]:
    """The ``key -> value`` of every ``:::MLLOG`` line (the last one wins)."""
    out: dict[str, Any] = {}
    for k, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.startswith(":::MLLOG"):
            continue
        try:
            rec = json.loads(line[len(":::MLLOG"):])
            out[rec["key"]] = rec["value"]
        except (ValueError, KeyError, TypeError):
            raise MeasuredError(f"{path}: line {k}: not a loadgen log record") from None
    return out


#: summary lines -> the detail log's keys (used only when there is no detail log)
_SUMMARY_KEYS = {
    "Scenario": "effective_scenario", "Completed samples per second": "result_completed_samples_per_sec",
    "Scheduled samples per second": "result_scheduled_samples_per_sec", "Samples per second": "result_samples_per_second",
    "Completed tokens per second": "result_completed_tokens_per_second", "Tokens per second": "result_tokens_per_second",
    "Mean latency (ns)": "result_mean_latency_ns", "Max latency (ns)": "result_max_latency_ns",
    "Mean First Token latency (ns)": "result_first_token_mean_latency_ns",
    "Mean Time to Output Token (ns)": "result_time_to_output_token_mean",
    "performance_sample_count": "effective_performance_sample_count", "Result is": "result_validity",
    "ttft_latency (ns)": "requested_server_ttft_latency", "tpot_latency (ns)": "requested_server_tpot_latency",
}
_SUMMARY_PCT = ((r"([\d.]+) percentile latency \(ns\)", "result_{}_percentile_latency_ns"),
                (r"([\d.]+) percentile first token latency \(ns\)", "result_first_token_{}_percentile_latency_ns"),
                (r"([\d.]+) percentile time to output token \(ns\)", "result_time_per_output_token_{}_percentile_ns"))


def read_summary(path: Path) -> dict[str, Any]:
    """The figures of ``mlperf_log_summary.txt`` under the detail log's keys."""
    out: dict[str, Any] = {}
    for line in path.read_text(errors="replace").splitlines():
        key, sep, val = line.partition(":")
        key, val = key.strip(), val.strip()
        if not sep or not val:
            continue
        name = _SUMMARY_KEYS.get(key)
        for pattern, fmt in _SUMMARY_PCT:
            if m := re.fullmatch(pattern, key):
                name = fmt.format(m.group(1))
        if name is None:
            continue
        try:
            out[name] = float(val) if re.fullmatch(r"[-+0-9.eE]+", val) else val
        except ValueError:
            out[name] = val
    return out


def _nearby(path: Path, names: tuple[str, ...]) -> list[Path]:
    found = []
    for d in (path, path.parent, path.parent.parent):
        found += [p for name in names for p in sorted(d.glob(name)) if p.is_file()]
    return found


def read_conf(path: Path) -> dict[tuple[str, str, str], str]:
    """``mlperf.conf``'s ``model.scenario.key = value`` lines."""
    out = {}
    for line in path.read_text(errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        key, sep, val = line.partition("=")
        parts = key.strip().split(".")
        if sep and len(parts) == 3:
            out[(parts[0], parts[1], parts[2])] = val.strip()
    return out


def identify_benchmark(conf: Mapping[tuple[str, str, str], str], log: Mapping[str, Any]) -> list[str]:
    """The benchmarks of ``conf`` whose settings match the log's (module docstring)."""
    def num(x: Any) -> float | None:
        try:
            return float(x)
        except (TypeError, ValueError):
            return None

    scenario = str(log.get("effective_scenario", ""))
    models = sorted({m for m, _, _ in conf if m != "*"})
    count = num(log.get("effective_performance_sample_count"))
    cands = [m for m in models if num(conf.get((m, "*", "performance_sample_count_override"))) == count]
    if log.get("requested_use_token_latencies") in (True, "true"):
        cands = [m for m in cands if conf.get((m, "*", "use_token_latencies")) == "1"]
    if scenario == "Server" and log.get("requested_server_ttft_latency") is not None:
        ttft_ms = num(log["requested_server_ttft_latency"]) / 1e6
        tpot_ms = num(log.get("requested_server_tpot_latency")) / 1e6
        cands = [m for m in cands if num(conf.get((m, "Server", "ttft_latency"))) == ttft_ms
                 and num(conf.get((m, "Server", "tpot_latency"))) == tpot_ms]
    return cands


def engine_args(readme: str, scenario: str, gpu_token: str | None) -> tuple[dict[str, Any], str] | None:
    """The engine flags of the harness README's launch command for ``scenario`` on ``gpu_token`` (``H100``), and
    the command line; None when the README has none."""
    section = sub = ""
    for raw in readme.splitlines():
        line = raw.strip().strip("`").strip()
        if raw.startswith("### "):
            section, sub = raw, ""
        elif raw.startswith("#### "):
            sub = raw
        in_scope = scenario.lower() in section.lower() and (gpu_token is None or gpu_token.lower() in sub.lower())
        is_launch = (re.search(r"\bvllm serve\b", line) is not None if scenario == "Server"
                     else ("--max-num-seqs" in line or "--max-model-len" in line))
        if in_scope and is_launch and not line.startswith(("nohup", "bash")):
            return _flags(line), line
    return None


def _flags(line: str) -> dict[str, Any]:
    tokens = shlex.split(line.replace("`", " "))
    out: dict[str, Any] = {}
    for i, tok in enumerate(tokens):
        if not tok.startswith("--"):
            continue
        name, eq, val = tok[2:].partition("=")
        name = name.replace("_", "-")
        if not eq:
            val = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else ""
        if name in FLAGS:
            col = FLAGS[name]
            out[col] = int(val) if col in _INT_FLAGS else float(val)
        elif name == "kv-cache-dtype" and val in KV_DTYPES:
            out["kv_dtype"] = val
        elif name in ("enable-prefix-caching", "no-enable-prefix-caching"):
            out["prefix_caching"] = name == "enable-prefix-caching"
        elif name == "kv-transfer-config":
            out["kv_transfer"] = val
    return out


def _version_tuple(v: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v or "")[:3])


def _system(path: Path, out: Imported) -> dict[str, Any]:
    files = _nearby(path, ("system.json", "*.json"))
    for p in files:
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "accelerator_model_name" in data:
            return data
    out.notes.append(f"{path}: no system description (system.json) found: GPU and engine unknown")
    return {}


def read(path: Path, facts: ModelFacts, context: Mapping[str, Any]) -> Imported:
    """The row of one loadgen scenario folder (or of each scenario folder directly inside ``path``)."""
    path = Path(path)
    if not is_scenario(path):
        subs = sorted(d for d in path.iterdir() if is_scenario(d)) if path.is_dir() else []
        if not subs:
            raise MeasuredError(f"{path}: no MLPerf loadgen log here ({DETAIL} or {SUMMARY})")
        out = Imported()
        for d in subs:
            out.extend(read(d, facts, context))
        return out
    out = Imported()
    log = read_summary(path / SUMMARY) if (path / SUMMARY).is_file() else {}
    log.update(read_detail(path / DETAIL) if (path / DETAIL).is_file() else {})
    origin = path / DETAIL if (path / DETAIL).is_file() else path / SUMMARY
    scenario = str(log.get("effective_scenario") or "")
    system = _system(path, out)
    accel = str(system.get("accelerator_model_name", ""))
    gpu = next((name for pat, name in GPU_NAMES if re.search(pat, accel, re.I)), None)
    token = next((t for t in GPU_TOKENS if re.search(rf"\b{t}", accel, re.I)), None)
    if accel and gpu is None:
        out.notes.append(f"{path}: accelerator {accel!r} has no lbbench GPU name: give --set gpu=NAME")
    version = re.match(r"(\d+)\.(\d+)", str(log.get("loadgen_version", "")))
    ver = f"{version.group(1)}.{version.group(2)}" if version else "?"
    submitter = str(system.get("submitter", "unknown"))
    values: dict[str, Any] = {
        "id": f"mlperf-v{ver}-{submitter}-{gpu or (token or 'gpu')}-{scenario}".lower().replace(" ", "-"),
        "stage": 0, "gpu": gpu,
        "source": f"MLPerf Inference v{ver} {system.get('division', '')}, {submitter}, "
                  f"{system.get('system_name', '?')}, {scenario}",
    }
    values.update(_engine(system, path, scenario, token, out))
    values.update(_benchmark(path, log, out))
    if values.get("tp") and system.get("accelerators_per_node"):
        try:
            gpus = int(system["accelerators_per_node"]) * int(system.get("number_of_nodes") or 1)
            values["replicas"] = max(gpus // values["tp"], 1)
        except ValueError:
            pass
    if log.get("result_validity") not in (None, "VALID"):
        out.notes.append(f"{path}: loadgen marks the result {log['result_validity']}")
    if log.get("num_errors"):
        out.notes.append(f"{path}: loadgen counted {log['num_errors']} errors")
    metrics = _metrics(log, scenario, out.notes, path)
    if metrics is None:
        out.problems.append(MeasuredRowError(origin, f"scenario {scenario or '?'!r}: only Server (Poisson) and "
                                                     "Offline (all at once) have an arrival kind in the schema",
                                             id=values["id"], stage=0, column="arrival"))
        return out
    values.update(metrics)
    out.rows.append(RawRow(origin, values))
    return out


def _engine(system: dict, path: Path, scenario: str, token: str | None, out: Imported) -> dict[str, Any]:
    stack = {str(k).lower(): str(v) for k, v in (system.get("other_software_stack") or {}).items()} \
        if isinstance(system.get("other_software_stack"), dict) else {}
    engine = version = None
    for name in ("vllm", "sglang"):
        if name in stack:
            engine, version = name, stack[name]
    if engine is None and (m := re.search(r"\b(vllm|sglang)\s*v?(\d[\w.]*)", str(system.get("framework", "")), re.I)):
        engine, version = m.group(1).lower(), m.group(2)
    values: dict[str, Any] = {"engine": engine, "engine_version": version}
    if engine != "vllm":
        return values
    for readme in _nearby(path, ("*README*.md", "*readme*.md")):
        found = engine_args(readme.read_text(errors="replace"), scenario, token)
        if found is None:
            continue
        flags, line = found
        transfer = flags.pop("kv_transfer", None)
        values.update(flags)
        values.setdefault("tp", 1)
        values.setdefault("kv_dtype", "auto")
        if transfer is None:
            values["cpu_offload_gib"] = 0.0
        if "prefix_caching" not in values and _version_tuple(version) >= (0, 8):
            values["prefix_caching"] = True
        out.notes.append(f"{path}: engine limits from {readme.name}: {line}; flags it lacks take vLLM "
                         f"{version}'s defaults (TP 1, KV dtype auto, no KV offload, prefix caching on)")
        return values
    out.notes.append(f"{path}: no harness README with the {scenario} launch command found: engine limits unknown")
    return values


def _benchmark(path: Path, log: dict, out: Imported) -> dict[str, Any]:
    confs = _nearby(path, ("mlperf.conf",))
    names = identify_benchmark(read_conf(confs[0]), log) if confs else []
    known = {BENCHMARKS[n] for n in names if n in BENCHMARKS}
    if len(known) == 1 and len(known) == len({BENCHMARKS.get(n) for n in names}):
        b = known.pop()
        out.notes.append(f"{path}: benchmark {'/'.join(names)}: {b.model}, up to {b.output_tokens} output tokens "
                         f"({b.source})")
        return {"model": b.model, "output_tokens": b.output_tokens, "ignore_eos": b.ignore_eos}
    out.notes.append(f"{path}: benchmark {'/'.join(names) or 'not identified'}: model and output length unknown "
                     "(give --set model=... output_tokens=...)")
    return {}


def _metrics(log: dict, scenario: str, notes: list[str], path: Path) -> dict[str, Any] | None:
    def pct(fmt: str, p: str) -> float | None:
        return ns_to_ms(log.get(fmt.format(p)))

    e2e = {"e2e_mean_ms": ns_to_ms(log.get("result_mean_latency_ns")),
           **{f"e2e_p{p}_ms": pct("result_{}_percentile_latency_ns", f"{p}.00") for p in (50, 90, 99)}}
    requests = None
    if log.get("generated_query_count") is not None:
        requests = int(log["generated_query_count"]) * int(log.get("generated_samples_per_query") or 1)
    if scenario == "Server":
        dur = log.get("generated_query_duration")
        return {"arrival": "poisson", "rate_rps": rounded(log.get("result_scheduled_samples_per_sec")),
                "duration_s": None if dur is None else round(float(dur) / 1e9, 3), "requests": requests, **e2e,
                "ttft_mean_ms": ns_to_ms(log.get("result_first_token_mean_latency_ns")),
                **{f"ttft_p{p}_ms": pct("result_first_token_{}_percentile_latency_ns", f"{p}.00") for p in (50, 90, 99)},
                "itl_mean_ms": ns_to_ms(log.get("result_time_to_output_token_mean")),
                **{f"tpot_p{p}_ms": pct("result_time_per_output_token_{}_percentile_ns", f"{p}.00") for p in (50, 99)},
                "throughput_rps": rounded(log.get("result_completed_samples_per_sec")),
                "output_tok_s": rounded(log.get("result_completed_tokens_per_second"), 2)}
    if scenario == "Offline":
        longest, shortest = log.get("result_max_latency_ns"), log.get("result_min_latency_ns")
        if longest and shortest and shortest > 0.5 * longest:
            notes.append(f"{path}: every sample completed between {shortest / 1e9:.1f} and {longest / 1e9:.1f} s: the "
                         "harness reported them together, not as each finished, so E2E is left empty")
            e2e = {}
        return {"arrival": "burst", "rate_rps": None, "requests": requests, **e2e,
                "duration_s": None if longest is None else round(float(longest) / 1e9, 3),
                "throughput_rps": rounded(log.get("result_samples_per_second")),
                "output_tok_s": rounded(log.get("result_tokens_per_second"), 2)}
    return None
