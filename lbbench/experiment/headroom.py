"""How much routing could buy on a setup, and how much of it each router captures (``lbbench headroom``).

``run_headroom(cfg, out_dir)`` runs, on the simulator, in parts (each an ordinary ``run_experiment`` run
directory under ``out_dir``):

1. ``tuning``: every classical heuristic (``CLASSICAL``) on *tuning* seeds, disjoint from the evaluation
   seeds (``cfg.seed + TUNING_SEED_OFFSET`` on); the one with the lowest mean E2E is "the best classical
   heuristic". It is chosen there and only evaluated on the evaluation seeds, so its row is not fitted to them.
2. ``baselines``: the production routers (``lbbench.metrics.reference.BASELINE_ROUTERS``) and ``random`` on
   the ``fcfs`` and vLLM ``priority`` instance schedulers; the strongest combination is found by
   ``lbbench.metrics.reference`` (the same rule as ``lbbench run`` and ``lbbench paper``: chosen on the
   reported seeds, which favours the baseline). On a mixed fleet the capacity-aware routers
   (``CAPACITY_ROUTERS``) join them, and the planner's base defaults to ``best`` (the cheapest of several bases
   on a fork): the FIFO KV gate it starts from on a uniform fleet assumes equal instances.
3. ``routers``: the best classical heuristic and every router asked for, on ``fcfs``.
4. ``planner`` and ``planner-reorder``: the oracle planner ``lookahead`` in the paper's action space and with
   reordering (labelled ``lookahead+reorder``).

The table keeps one row per role: round robin, random, the best classical heuristic, the strongest
combination, each asked router, and the planners; every row says whether it is ``deployable`` (the planners
are not: they read true lengths and future arrivals). Each row gets

    headroom_captured = (RR - router) / (RR - planner)

on mean E2E over the evaluation seeds (RR: round robin on fcfs; planner: the head-of-line ``lookahead``),
and ``headroom_captured_reorder`` against the reordering planner. A planner no better than round robin
leaves the share undefined (null).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from ..metrics.reference import BASELINE_ROUTERS, with_reference
from ..metrics.summary import summarize
from ..routers.lookahead import parse_params
from ..rundir import HEADROOM_FILE, read_requests
from .config import ConfigError, RunConfig
from .runner import run_experiment
from .units import Reporter

#: the classical heuristics the best one is chosen from (the paper's and production policies, and the gate)
CLASSICAL: tuple[str, ...] = ("jsq", "least_requests", "power_of_two", "min_min", "mcu", "decode_balancer",
                              "late_binding_srpt")
#: instance schedulers of the strongest combination
COMBO_SCHEDULERS: tuple[str, ...] = ("fcfs", "priority")
#: tuning seeds start this far above the first evaluation seed
TUNING_SEED_OFFSET = 1000
PLANNER = "lookahead"
PLANNER_REORDER = "lookahead+reorder"

COLUMNS: tuple[str, ...] = ("role", "router", "instance_scheduler", "deployable", "seeds", "mean_e2e_s",
                            "mean_e2e_std_s", "p50_e2e_s", "p99_e2e_s", "preemptions", "mean_router_wait_s",
                            "improvement_vs_round_robin_pct", "vs_best_baseline_pct", "headroom_captured",
                            "headroom_captured_reorder", "mean_ttft_s", "mean_ttft_std_s", "p99_ttft_s",
                            "headroom_captured_ttft")


@dataclass
class HeadroomResult:
    table: pl.DataFrame
    best_heuristic: str | None
    tuning_seeds: list[int]
    best_baseline: str | None
    complete: bool
    path: Path


#: deployable routers that weigh each instance by its own speed: baselines on a mixed fleet
CAPACITY_ROUTERS: tuple[str, ...] = ("weighted_round_robin", "jsq_speed", "least_work_speed", "mcu")


def tuning_seeds(cfg: RunConfig, n: int) -> list[int]:
    """The seeds the best classical heuristic is chosen on; never an evaluation seed."""
    first = cfg.seed + TUNING_SEED_OFFSET
    seeds = list(range(first, first + n))
    if set(seeds) & set(cfg.seed_list()):
        raise ConfigError(f"{cfg.seeds}: the evaluation seeds reach the tuning seeds ({first} on); use fewer "
                          "than 1000", "seeds")
    return seeds


def _part(cfg: RunConfig, out: Path, name: str, reporter: Reporter, executor: Any, **changes: Any
          ) -> tuple[pl.DataFrame, bool]:
    part_cfg = replace(cfg, **changes)
    outcome = run_experiment(part_cfg, out / name, reporter=reporter, executor=executor)
    df = read_requests(outcome.path)
    return (pl.DataFrame() if df is None else df), outcome.complete


def run_headroom(cfg: RunConfig, out_dir: Path | str, *, routers: list[str] | None = None, num_tuning_seeds: int = 2,
                 planner_options: dict[str, Any] | None = None, reorder: bool = True,
                 reporter: Reporter | None = None, executor: Any = None) -> HeadroomResult:
    """Run every part (see the module docstring) into ``out_dir`` and return the headroom table.

    ``cfg`` gives the setup (profile, instances, workload or trace, rate, requests, predictor, seeds, jobs);
    its routers are ignored (``routers``: the extra routers to show). Ctrl-C or a part that did not complete
    stops the run: the table is made from what was measured and ``complete`` is False.
    """
    if cfg.live:
        raise ConfigError("headroom runs on the simulator only (the planner is an oracle)", "endpoints")
    parse_params(dict(planner_options or {}))  # a bad planner option fails before any run
    out = Path(out_dir)
    reporter = reporter or Reporter()
    asked = [r for r in (routers or []) if r not in (PLANNER, PLANNER_REORDER)]
    tune = tuning_seeds(cfg, num_tuning_seeds)
    plan_opts = {k: v for k, v in (planner_options or {}).items() if k != "reorder"}
    mixed = not cfg.fleet_of().is_uniform
    if mixed:  # the FIFO KV gate assumes equal instances: on a mixed fleet the planner starts from the best base
        plan_opts.setdefault("base", "best")
    frames: list[pl.DataFrame] = []
    complete = True
    best: str | None = None

    def part(name: str, **changes: Any) -> None:
        nonlocal complete
        df, ok = _part(cfg, out, name, reporter, executor, **changes)
        if df.height:
            frames.append(df)
        complete = complete and ok

    try:
        df, ok = _part(cfg, out, "tuning", reporter, executor, routers=list(CLASSICAL), seed=tune[0],
                       seeds=len(tune), instance_schedulers=["fcfs"], router_options={})
        if not ok:
            complete = False
        if df.height:
            means = (df.filter(pl.col("error").is_null())
                     .group_by("router", "seed").agg((pl.col("finish_s") - pl.col("arrival_s")).mean().alias("m"))
                     .group_by("router").agg(pl.col("m").mean()).sort("m"))
            best = means["router"][0]
        if complete:
            base = list(dict.fromkeys(["round_robin", "random", *BASELINE_ROUTERS,
                                       *(CAPACITY_ROUTERS if mixed else ())]))
            part("baselines", routers=base, instance_schedulers=list(COMBO_SCHEDULERS), router_options={})
        others = [r for r in dict.fromkeys(([best] if best else []) + asked)
                  if r not in ("round_robin", "random", "jsq", "least_requests", "power_of_two")]
        if complete and others:
            part("routers", routers=others, instance_schedulers=["fcfs"],
                 router_options={k: v for k, v in cfg.router_options.items() if k in others})
        if complete:
            part("planner", routers=[PLANNER], instance_schedulers=["fcfs"],
                 router_options={PLANNER: {**plan_opts, "reorder": False}})
        if complete and reorder:
            df, ok = _part(cfg, out, "planner-reorder", reporter, executor, routers=[PLANNER],
                           instance_schedulers=["fcfs"], router_options={PLANNER: {**plan_opts, "reorder": True}})
            if df.height:
                frames.append(df.with_columns(pl.lit(PLANNER_REORDER).alias("router")))
            complete = complete and ok
    except KeyboardInterrupt:
        complete = False
    table, ref = headroom_table(frames, best, tune, asked)
    out.mkdir(parents=True, exist_ok=True)
    table.write_parquet(out / HEADROOM_FILE)
    return HeadroomResult(table, best, tune, ref, complete, out)


def headroom_table(frames: list[pl.DataFrame], best: str | None, tune: list[int], asked: list[str]
                   ) -> tuple[pl.DataFrame, str | None]:
    """(the headroom table, the strongest combination's label) from every part's request rows."""
    if not frames:
        return pl.DataFrame(schema={c: pl.String for c in COLUMNS}), None
    df = pl.concat(frames, how="diagonal_relaxed")
    by = ["router", "instance_scheduler"]
    summary = with_reference(summarize(df, by=by), df, by)
    rows = {(r["router"], r["instance_scheduler"]): r for r in summary.to_dicts()}
    ref_label = next((r["best_baseline"] for r in rows.values() if r.get("best_baseline")), None)
    rr = rows.get(("round_robin", "fcfs"), {}).get("mean_e2e_s")
    plan = rows.get((PLANNER, "fcfs"), {}).get("mean_e2e_s")
    plan_re = rows.get((PLANNER_REORDER, "fcfs"), {}).get("mean_e2e_s")
    rr_ttft = rows.get(("round_robin", "fcfs"), {}).get("mean_ttft_s")
    plan_ttft = rows.get((PLANNER, "fcfs"), {}).get("mean_ttft_s")

    def share(m: float | None, p: float | None, ref: float | None = None) -> float | None:
        ref = rr if ref is None else ref
        if ref is None or p is None or m is None or not ref - p > 0:
            return None
        return (ref - m) / (ref - p)

    picked: list[tuple[str, tuple[str, str]]] = [("round robin", ("round_robin", "fcfs")),
                                                 ("random", ("random", "fcfs"))]
    if best:
        picked.append((f"best classical heuristic (tuned on seeds {tune[0]}-{tune[-1]})", (best, "fcfs")))
    if ref_label:
        name, _, sched = ref_label.partition("/")
        picked.append(("strongest router x instance scheduler", (name, sched or "fcfs")))
    picked += [("asked", (r, "fcfs")) for r in asked if r != best]
    picked += [("planner (oracle)", (PLANNER, "fcfs")), ("planner, reordering (oracle)", (PLANNER_REORDER, "fcfs"))]
    out = []
    for role, key in picked:
        row = rows.get(key)
        if row is None:
            continue
        m = row["mean_e2e_s"]
        out.append({
            "role": role, "router": key[0], "instance_scheduler": key[1],
            "deployable": key[0] not in (PLANNER, PLANNER_REORDER), "seeds": row["seeds"], "mean_e2e_s": m,
            "mean_e2e_std_s": row["mean_e2e_std_s"], "p50_e2e_s": row["p50_e2e_s"], "p99_e2e_s": row["p99_e2e_s"],
            "preemptions": row["preemptions"], "mean_router_wait_s": row["mean_router_wait_s"],
            "improvement_vs_round_robin_pct": None if rr is None else 100.0 * (rr - m) / rr,
            "vs_best_baseline_pct": row.get("vs_best_baseline_pct"),
            "headroom_captured": share(m, plan), "headroom_captured_reorder": share(m, plan_re),
            "mean_ttft_s": row.get("mean_ttft_s"), "mean_ttft_std_s": row.get("mean_ttft_std_s"),
            "p99_ttft_s": row.get("p99_ttft_s"),
            "headroom_captured_ttft": share(row.get("mean_ttft_s"), plan_ttft, rr_ttft),
        })
    schema = {"role": pl.String, "router": pl.String, "instance_scheduler": pl.String, "deployable": pl.Boolean,
              "seeds": pl.Int64, **{c: pl.Float64 for c in COLUMNS[5:]}}
    return pl.DataFrame(out, schema=schema), ref_label
