"""Simulate measured experiments and set every metric beside its measured value.

:func:`simulate_rows` groups rows by experiment ``id``, builds each :class:`~lbbench.validation.setup.Setup`,
runs it on the simulator (``replicas`` engines behind round robin, the engine's FCFS scheduler), and returns one
long frame: a row per (experiment, stage, metric) the measurement has, with the measured and predicted value and
the relative error, plus one row per experiment it could not cover with the reason. Experiments run on an
executor (``lbbench.distributed``: serial, a process pool, or Ray), each a deterministic unit.

ITL: with a fixed output length (``ignore_eos``), a stage's mean time per output token must equal
``(mean E2E - mean TTFT) / (output - 1)``. A measured mean ITL that is off that by more than 10 %, or below one read
of the model's weights per step (which no decode step can beat), is not a time per token (inference-perf's training
summaries report such values: their token counts come from re-tokenizing the streamed text); it is flagged,
replaced by that derived figure, and the row says so.

The same sources count output tokens by re-tokenizing the streamed text, so their per-token figures disagree with
the output length asked for: when a stage's ``output_tok_s`` is off ``throughput_rps x output_tokens`` by more
than 10 %, or its ITL was replaced as above, its TPOT percentiles and ``output_tok_s`` are not compared (the row
says why).

Stages the measurement stopped early (it completed fewer than 90 % of the requests it scheduled: the overloaded
stages, where inference-perf's run was cut) are cut at their end in the simulation too.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import polars as pl

from ..roofline import RooflineEfficiency
from ..routers import get_router
from ..sim.cluster import ClusterSim
from .metrics import METRICS, stage_metrics
from .setup import PromptAssumption, Setup, build_setup, flag, mlperf_prompts_for, number, value

#: columns of the frame :func:`simulate_rows` returns
COLUMNS = ("id", "stage", "metric", "measured", "predicted", "error_pct", "model", "gpu", "tp", "weights_dtype",
           "source", "note", "not_covered", "sim_wall_s", "cut")


@dataclass(frozen=True)
class Unit:
    key: str
    rows: tuple[Any, ...]
    eff: RooflineEfficiency
    eff_source: str
    api_overhead_s: float
    prompts: PromptAssumption | None
    seed: int
    max_stage_s: float | None

    @property
    def label(self) -> str:
        """The experiment's id (what an executor's error names)."""
        return self.key


def group_rows(rows: Sequence[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        out[str(value(r, "id"))].append(r)
    return dict(out)


def _weights_floor_ms(setup: Setup) -> float | None:
    """One read of the weights a step streams at the GPU's full bandwidth (a lower bound on any step)."""
    if setup.profile is None or not setup.profile.roofline:
        return None
    s = setup.profile.roofline
    per_layer = s["attn_bytes"] + (s["mlp_bytes"] if s["num_layers"] > s["num_moe_layers"] else s["moe_fixed_bytes"])
    weights = s["num_layers"] * per_layer + s["lm_head_bytes"]
    return weights / s["memory_bw_bytes_s"] * 1e3


def simulate_unit(unit: Unit) -> list[dict[str, Any]]:
    """Every (stage, metric) row of one experiment (module level: runs on any executor)."""
    t0 = time.perf_counter()
    setup = build_setup(unit.key, unit.rows, unit.eff, eff_source=unit.eff_source,
                        api_overhead_s=unit.api_overhead_s, prompts=unit.prompts, seed=unit.seed)
    first = setup.rows[0]
    base = {"id": unit.key, "model": value(first, "model"), "gpu": value(first, "gpu"),
            "tp": int(number(first, "tp") or 1), "weights_dtype": value(first, "weights_dtype"),
            "source": value(first, "source")}
    if setup.not_covered is not None:
        return [{**base, "stage": None, "metric": None, "measured": None, "predicted": None, "error_pct": None,
                 "note": None, "not_covered": setup.not_covered, "sim_wall_s": 0.0, "cut": None}]
    requests, stage_of, spans = setup.requests, setup.stage_of, setup.stage_spans_s
    scheduled = np.array([r.arrival_s for r in setup.requests])
    cut = [stage_was_cut(row, b - a) for row, (a, b) in zip(setup.rows, spans)]
    if unit.max_stage_s is not None:  # a shortened run (calibration): the first max_stage_s of each stage
        keep = [i for i, r in enumerate(requests)
                if r.arrival_s - spans[int(stage_of[i])][0] < unit.max_stage_s]
        requests = [requests[i] for i in keep]
        stage_of_new = np.full(len(setup.requests), -1)
        for i in keep:
            stage_of_new[i] = stage_of[i]
        stage_of = stage_of_new
        spans = [(a, min(b, a + unit.max_stage_s)) for a, b in spans]
    sim = ClusterSim(setup.profile, setup.replicas, requests, instance_scheduler="fcfs", seed=unit.seed,
                     run_id=unit.key)
    records = sim.run(get_router("round_robin", num_instances=setup.replicas, seed=unit.seed,
                                 profile=setup.profile))
    per_stage = stage_metrics(records, stage_of, scheduled, spans, cut)
    wall = time.perf_counter() - t0
    floor_ms = _weights_floor_ms(setup)
    note = "; ".join(setup.notes) or None
    out = []
    for row in setup.rows:
        k = int(number(row, "stage") or 0)
        pred = per_stage[k]
        itl = number(row, "itl_mean_ms")
        itl_flag = _checked_itl(row, itl, floor_ms)[1] if itl is not None else None
        retokenized = itl_flag is not None or _retokenized_counts(row)
        for metric in METRICS:
            meas = number(row, metric)
            row_note = note
            if metric == "itl_mean_ms" and meas is not None:
                meas, flagged = _checked_itl(row, meas, floor_ms)
                row_note = "; ".join(x for x in (note, flagged) if x) or None
            if meas is None or (retokenized and metric in PER_TOKEN):
                continue
            p = pred.get(metric)
            err = None if p is None or meas == 0 else (p / meas - 1.0) * 100.0
            if cut[k]:
                row_note = "; ".join(x for x in (row_note, "overloaded: the measurement was cut at the stage's end, "
                                                 "so is the simulation") if x)
            out.append({**base, "stage": k, "metric": metric, "measured": meas, "predicted": p, "error_pct": err,
                        "note": row_note, "not_covered": None, "sim_wall_s": wall, "cut": cut[k]})
    return out


#: figures computed from the source's own token counts
PER_TOKEN = ("tpot_p50_ms", "tpot_p99_ms", "output_tok_s")


def _retokenized_counts(row: Any) -> bool:
    """Whether the row's output-token rate disagrees with its completions x the output length asked for."""
    tok_s, rps, n_out = number(row, "output_tok_s"), number(row, "throughput_rps"), number(row, "output_tokens")
    return bool(tok_s and rps and n_out and flag(row, "ignore_eos") and abs(tok_s / (rps * n_out) - 1) > 0.10)


def stage_was_cut(row: Any, duration_s: float | None = None) -> bool:
    """Whether the measurement completed fewer than 90 % of the requests it scheduled in the stage."""
    done, n = number(row, "throughput_rps"), number(row, "requests")
    dur = duration_s if duration_s is not None else number(row, "duration_s")
    return bool(done is not None and n and dur and done * dur < 0.9 * n)


def _checked_itl(row: Any, itl_ms: float, floor_ms: float | None) -> tuple[float | None, str | None]:
    """The measured mean ITL, or the one its own means imply when it cannot be a time per token."""
    e2e, ttft, n_out = number(row, "e2e_mean_ms"), number(row, "ttft_mean_ms"), number(row, "output_tokens")
    derived = (e2e - ttft) / (n_out - 1) if e2e is not None and ttft is not None and n_out and n_out > 1 else None
    why = None
    if floor_ms is not None and itl_ms < floor_ms:
        why = f"below one weight read ({floor_ms:.2f} ms at full bandwidth)"
    elif derived is not None and flag(row, "ignore_eos") and abs(itl_ms / derived - 1) > 0.10:
        why = f"off (E2E - TTFT) / (output - 1) = {derived:.2f} ms by {abs(itl_ms / derived - 1) * 100:.0f} %"
    if why is None:
        return itl_ms, None
    return derived, f"measured ITL {itl_ms:g} ms is {why}: replaced by the derived {derived:.2f} ms"


def simulate_rows(rows: Sequence[Any], eff: RooflineEfficiency, *, eff_source: str = "", api_overhead_s: float = 0.0,
                  prompts: PromptAssumption | None = None, seed: int = 0, jobs: int = 1,
                  max_stage_s: float | None = None, executor: Any = None) -> pl.DataFrame:
    """The long frame of predicted against measured (see the module docstring). ``executor``: an open
    ``lbbench.distributed`` executor to reuse (a calibration calls this many times); else one of ``jobs``."""
    from ..distributed import get_executor  # lazy: the executors pull in multiprocessing machinery

    if executor is None:
        with get_executor(jobs) as ex:
            return simulate_rows(rows, eff, eff_source=eff_source, api_overhead_s=api_overhead_s, prompts=prompts,
                                 seed=seed, max_stage_s=max_stage_s, executor=ex)
    units = []
    for key, grp in group_rows(rows).items():
        p = prompts if prompts is not None else mlperf_prompts_for(grp[0])
        units.append(Unit(key, tuple(grp), eff, eff_source, api_overhead_s, p, seed, max_stage_s))
    results: list[list[dict]] = [[] for _ in units]
    for i, res in executor.submit(units, simulate_unit):
        results[i] = res
    flat = [r for res in results for r in res]
    return pl.DataFrame(flat, schema={c: _dtype(c) for c in COLUMNS})


def _dtype(col: str):
    if col in ("stage", "tp"):
        return pl.Int64
    if col in ("measured", "predicted", "error_pct", "sim_wall_s"):
        return pl.Float64
    if col == "cut":
        return pl.Boolean
    return pl.Utf8
