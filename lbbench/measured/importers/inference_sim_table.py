"""inference-sim's measured-with-workload table -> one row per load stage.

The table (``trainval_measured_with_workload.csv``, from ``inference-sim/sim-to-real-accuracy-validation`` and
``inference-sim/inference-sim`` testdata) has one line per experiment and stage with its engine limits, its
inference-perf ``shared_prefix`` workload and the measured means and percentiles. Columns read::

    experiment stage model tp max_num_seqs mbt gpu_kv_blocks_x16tok cpu_kv_blocks rate_rps duration_s
    sys_prompt_len question_len output_len n_sys_prompts users_per_prompt multi_turn
    e2e_mean_ms e2e_p90_ms e2e_p99_ms ttft_mean_ms ttft_p90_ms ttft_p99_ms itl_mean_ms

- Stage ``-1`` lines aggregate an experiment's stages and are left out (counted in a note).
- Lines that carry metrics but no setup (the 16 training experiments, whose setup is in their inference-perf
  folders: import those) are reported as problems, never turned into rows.
- ``requests`` is ``rate_rps x duration_s``: inference-perf's constant load sends exactly that many.
- ``cpu_offload_gib`` comes from ``cpu_kv_blocks``: blocks x 16 tokens x the model's KV bytes per token on one of
  the ``tp`` GPUs / 2^30 (8 GiB for every experiment that offloads); it needs the model's config.
- **ITL.** The table's ``itl_mean_ms`` is ``(E2E - TTFT) / (output - 1)`` over the stage's means with the output
  counted by re-tokenizing the returned text (the inference-sim README; it reproduces the training folders'
  ``9.264`` ms for the Llama-2-7B codegen stage from its 193.7 re-tokenized tokens). With ``ignore_eos`` every
  request generates ``output_len`` tokens, so when the context says ``ignore_eos=true`` the importer computes
  ``(e2e_mean - ttft_mean) / (output_len - 1)`` instead — exact for a fixed output length — and notes where the
  table differs by more than 1 %. Without that knowledge the table's figure is kept.
- Not in the table: the GPU, the engine and its version, the arrival process (inference-sim sends a constant rate),
  ``ignore_eos``, ``max_model_len``, prefix caching, the KV dtype: give them with ``--set``.

``testdata_trained_physics_iter29.json`` is *not* a source: its ``expected`` figures are what inference-sim's
simulator predicts (a regression fixture), not measurements.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Mapping

from ..model_facts import ModelFacts
from ..schema import BY_NAME, CellError, MeasuredError, MeasuredRowError, parse_cell
from .common import Imported, RawRow

#: table column -> schema column (same name where absent)
RENAMES = {"experiment": "id", "mbt": "max_num_batched_tokens", "gpu_kv_blocks_x16tok": "gpu_kv_blocks",
           "sys_prompt_len": "system_prompt_tokens", "question_len": "question_tokens",
           "output_len": "output_tokens", "n_sys_prompts": "prefix_groups", "users_per_prompt": "prompts_per_group"}
TABLE_COLUMNS = ("experiment", "stage", "model", "tp", "max_num_seqs", "mbt", "gpu_kv_blocks_x16tok",
                 "cpu_kv_blocks", "rate_rps", "duration_s", "sys_prompt_len", "question_len", "output_len",
                 "n_sys_prompts", "users_per_prompt", "multi_turn", "e2e_mean_ms", "e2e_p90_ms", "e2e_p99_ms",
                 "ttft_mean_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_mean_ms")
KV_BLOCK_TOKENS = 16


def looks_like(header: list[str]) -> bool:
    return {"experiment", "gpu_kv_blocks_x16tok", "itl_mean_ms"} <= set(header)


def read(path: Path, facts: ModelFacts, context: Mapping[str, Any]) -> Imported:
    """Rows of the table at ``path``; the context's ``ignore_eos`` selects how ITL is computed."""
    path = Path(path)
    ignore_eos = context.get("ignore_eos")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            lines = list(csv.DictReader(f))
            header = list(lines[0].keys()) if lines else []
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise MeasuredError(f"{path}: not a readable CSV ({exc})") from None
    missing = [c for c in TABLE_COLUMNS if c not in header]
    if missing:
        raise MeasuredError(f"{path}: header: missing column {missing[0]!r} of inference-sim's table")
    out = Imported()
    aggregates = 0
    for n, line in enumerate(lines, start=1):
        if line["stage"].strip() == "-1":
            aggregates += 1
            continue
        values: dict[str, Any] = {}
        try:
            for col in TABLE_COLUMNS:
                name = RENAMES.get(col, col)
                if name in BY_NAME:
                    values[name] = parse_cell(name, line[col] or "")
            cpu_blocks = parse_cell("gpu_kv_blocks", line["cpu_kv_blocks"] or "")
        except CellError as exc:
            raise MeasuredError(f"{path}: row {n} (id={line['experiment']}, stage={line['stage']}): {exc}") from None
        if values.get("model") is None:
            out.problems.append(MeasuredRowError(
                path, "metrics only: the table gives no setup for this experiment (import its inference-perf "
                      "folder instead)", row=n, id=values.get("id"), stage=values.get("stage"), column="model"))
            continue
        values["source"] = f"inference-sim measured table {path.name}"
        values["requests"] = round(values["rate_rps"] * values["duration_s"]) \
            if values.get("rate_rps") and values.get("duration_s") else None
        values["weights_dtype"] = facts.weights_dtype(values["model"])
        values["cpu_offload_gib"] = _offload_gib(facts, values, cpu_blocks, out, path.name)
        if ignore_eos and values.get("output_tokens", 0) > 1 and values.get("e2e_mean_ms") is not None \
                and values.get("ttft_mean_ms") is not None:
            itl = round((values["e2e_mean_ms"] - values["ttft_mean_ms"]) / (values["output_tokens"] - 1), 3)
            table = values.get("itl_mean_ms")
            if table is not None and abs(table - itl) > 0.01 * itl:
                out.notes.append(f"{values['id']} stage {values['stage']}: itl_mean_ms {itl:g} = (E2E - TTFT) / "
                                 f"({values['output_tokens']} - 1) with ignore_eos; the table's {table:g} counts "
                                 f"{(values['e2e_mean_ms'] - values['ttft_mean_ms']) / table + 1:.1f} re-tokenized "
                                 "tokens")
            values["itl_mean_ms"] = itl
        out.rows.append(RawRow(path, values))
    if aggregates:
        out.notes.append(f"{path.name}: {aggregates} lines of stage -1 (an experiment's stages together) left out")
    return out


def _offload_gib(facts: ModelFacts, values: dict, cpu_blocks: int | None, out: Imported, name: str
                 ) -> float | None:
    if cpu_blocks is None:
        return None
    if cpu_blocks == 0:
        return 0.0
    per_token = facts.kv_bytes_per_token_per_gpu(values["model"], values.get("kv_dtype"), values["tp"])
    if per_token is None:
        out.notes.append(f"{values['id']} stage {values['stage']}: cpu_offload_gib unknown: {cpu_blocks} CPU KV "
                         f"blocks, but {facts.config(values['model'])[1]}")
        return None
    return round(cpu_blocks * KV_BLOCK_TOKENS * per_token / 2 ** 30, 2)
