"""Importers: raw results of each benchmarking tool -> rows of the measured-runs schema.

``import_measured(kind, paths, context, model_dirs)`` runs the importer of ``kind`` (or, for ``auto``, the one each
path's shape identifies) on every path and finishes the rows through the schema (``common.finish``). Each importer
module's docstring gives its source's metric definitions, with the source repository and commit they were read
from, and what it derives.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..model_facts import ModelFacts
from ..schema import MeasuredError, MeasuredRow, MeasuredRowError, format_cell
from . import aiperf, guidellm, inference_perf, inference_sim_table, lbbench_run, mlperf, vllm_bench
from .common import Imported, finish, parse_context

Reader = Callable[[Path, ModelFacts, Mapping[str, Any]], Imported]
#: kind -> (reader, what it reads)
KINDS: dict[str, tuple[Reader, str]] = {
    "inference-perf": (inference_perf.read, "inference-perf experiment folder(s): results/config.yaml + stage_N "
                                            "metrics (inference-sim campaigns)"),
    "inference-sim-table": (inference_sim_table.read, "inference-sim's trainval_measured_with_workload.csv"),
    "mlperf": (mlperf.read, "MLPerf loadgen scenario folder: mlperf_log_detail.txt / _summary.txt, mlperf.conf, "
                            "system.json, the harness README"),
    "vllm-bench": (vllm_bench.read, "'vllm bench serve --save-result' JSON (one object per run)"),
    "guidellm": (guidellm.read, "GuideLLM benchmarks report JSON"),
    "aiperf": (aiperf.read, "AIPerf profile_export_aiperf.json or .csv"),
    "lbbench-run": (lbbench_run.read, "lbbench live run directory (requests.parquet + run.toml)"),
}


def detect(path: Path) -> str:
    """The kind of raw result at ``path``, from its shape; ``MeasuredError`` when it matches none."""
    path = Path(path)
    if path.is_dir():
        if lbbench_run.is_run(path):
            return "lbbench-run"
        if mlperf.is_scenario(path) or any(mlperf.is_scenario(d) for d in path.iterdir() if d.is_dir()):
            return "mlperf"
        if inference_perf.is_experiment(path) or any(inference_perf.is_experiment(d) for d in path.iterdir()):
            return "inference-perf"
    elif path.is_file():
        suffix = path.suffix.lower()
        try:
            if suffix == ".csv":
                text = path.read_text(encoding="utf-8-sig", errors="replace")
                if aiperf.looks_like_csv(text):
                    return "aiperf"
                header = next(csv.reader([text.split("\n", 1)[0]]), [])
                if inference_sim_table.looks_like(header):
                    return "inference-sim-table"
            elif suffix in (".json", ".jsonl"):
                objs = vllm_bench.load_objects(path)
                if objs and all(vllm_bench.looks_like(o) for o in objs):
                    return "vllm-bench"
                if len(objs) == 1 and guidellm.looks_like(objs[0]):
                    return "guidellm"
                if len(objs) == 1 and aiperf.looks_like(objs[0]):
                    return "aiperf"
        except (OSError, MeasuredError, json.JSONDecodeError):
            pass
    elif not path.exists():
        raise MeasuredError(f"{path}: no such file or directory")
    raise MeasuredError(f"{path}: cannot tell which tool wrote this; give the kind ({', '.join(KINDS)})")


@dataclass
class ImportReport:
    """The rows imported, the stages that could not be (one line each) and the notes on what was derived."""

    rows: list[MeasuredRow] = field(default_factory=list)
    problems: list[MeasuredRowError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


def import_measured(kind: str, paths: Sequence[str | Path], context: Mapping[str, Any] | Sequence[str] = (),
                    model_dirs: Sequence[str | Path] = ()) -> ImportReport:
    """Import every path with the ``kind`` importer (``auto``: detected per path); ``context`` is
    ``column -> value`` (or ``["column=value", ...]``) applied to every row."""
    if kind != "auto" and kind not in KINDS:
        raise MeasuredError(f"unknown kind {kind!r} (known: auto, {', '.join(KINDS)})")
    ctx = parse_context(context if not isinstance(context, Mapping)
                        else [f"{k}={format_cell(v)}" for k, v in context.items()])
    facts = ModelFacts(tuple(Path(d) for d in model_dirs))
    imported = Imported()
    kinds = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise MeasuredError(f"{p}: no such file or directory")
        k = detect(p) if kind == "auto" else kind
        kinds.append(k)
        imported.extend(KINDS[k][0](p, facts, ctx))
    rows, problems, notes = finish(imported, ctx)
    if not rows and not problems:
        raise MeasuredError(f"{', '.join(str(p) for p in paths)}: no load stage found")
    return ImportReport(rows, problems, notes, kinds)
