"""Capacity planning across hardware: for this traffic and these SLOs, how many of which GPU?

``plan_capacity(PlanConfig)`` does, for every GPU x tensor-parallel size x router (x instance scheduler):

1. derive the profile in memory (``lbbench.profiling.derive``: model config x GPU table; physics-derived,
   not measured). A model that does not fit the GPU at that TP is skipped with one note.
2. search (``search.min_instances``) for the smallest instance count whose SLO attainment meets the target.
   Each count is evaluated by the project's one runner (``experiment.simulate``: the one unit body, simulated)
   on the same seeds, so every count sees exactly the same requests (paired seeds).
3. report the count with its attainment, the attainment at one instance fewer, goodput and latencies, and,
   with prices, what the count costs.

**SLO attainment** is ``metrics.summary``'s ``slo_attainment``, the number ``lbbench run --slo`` and
``lbbench report --slo`` print: per seed, the share of *all* requests (failed ones are misses) that completed
with TTFT <= the TTFT limit and their own mean time between tokens <= the TBT limit (and E2E <= the E2E limit
when given); averaged over seeds. ``goodput_per_s`` is the same summary's: requests within the SLO per second
of the run. Latency columns are over completed requests, per seed, averaged over seeds.

Searches are independent, so they run side by side on ``lbbench.distributed``'s executor (``jobs``
processes, or a Ray cluster); within a search the counts run one after another (each depends on the last).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import polars as pl

from ..distributed import get_executor
from ..errors import InputError
from ..experiment import RunConfig, simulate
from ..profiles import Profile, profile_from_dict
from ..metrics.summary import Slo, completed_expr, derive, per_seed
from ..profiling.gpus import UnknownGPUError, get_gpu
from ..profiling.models import load_model_config
from .prices import cost_columns, load_prices, price_of
from .search import SearchResult, TargetNotMetError, min_instances

#: the columns of a plan row, in order (``usd_*`` only with prices)
ROW_COLUMNS: tuple[str, ...] = (
    "gpu", "tp", "router", "instance_scheduler", "instances", "gpus", "attainment", "attainment_at_fewer",
    "goodput_per_s", "mean_e2e_s", "p99_e2e_s", "mean_ttft_s", "p99_ttft_s", "mean_tbt_s", "tokens_per_s",
    "completed", "failed", "monotone", "evaluations", "profile",
)
PRICE_COLUMNS: tuple[str, ...] = ("usd_per_hour", "usd_per_million_tokens")
#: the metrics kept for every evaluated count (the plot's points)
POINT_COLUMNS: tuple[str, ...] = (
    "attainment", "goodput_per_s", "mean_e2e_s", "p99_e2e_s", "mean_ttft_s", "p99_ttft_s", "mean_tbt_s",
    "tokens_per_s", "completed", "failed",
)


class PlanError(InputError):
    """A plan that cannot be made as asked (the field names the setting)."""


@dataclass
class PlanConfig:
    """What ``lbbench plan`` asks: the traffic (a ``RunConfig``'s workload fields), the SLO and the hardware."""

    run: RunConfig
    """Workload, trace, rate, requests, seeds, routers, instance schedulers, predictor (``instances`` unused)."""
    model: str
    """A shipped model config name or a ``config.json`` path."""
    gpus: list[str]
    tps: list[int] = field(default_factory=lambda: [1])
    slo: Slo = field(default_factory=Slo)
    attainment: float = 0.99
    """Target share of requests within the SLO, in (0, 1]."""
    max_instances: int = 64
    dtype: str = "bf16"
    price_file: str | None = None
    jobs: int = 1
    ray: str | None = None
    """A Ray cluster address (``auto``) to run the searches on; None: ``jobs`` local processes."""
    calibration: str | None = None
    """A calibration TOML whose efficiency factors the derived profiles take; None: the shipped one."""

    def check(self) -> None:
        if not 0 < self.attainment <= 1:
            raise PlanError(f"{self.attainment:g} must be in (0, 1] (a share of requests)", "attainment")
        if self.max_instances < 1:
            raise PlanError(f"{self.max_instances}: need at least one instance", "max_instances")
        if all(v is None for v in (self.slo.ttft_s, self.slo.tbt_s, self.slo.e2e_s)):
            raise PlanError("give at least one limit (ttft=S, tbt=S or e2e=S)", "slo")
        if not self.gpus:
            raise PlanError("give at least one GPU", "gpu")
        if not self.tps or any(t < 1 for t in self.tps):
            raise PlanError("tensor-parallel sizes must be >= 1", "tp")
        if self.jobs < 1:
            raise PlanError(f"{self.jobs}: must be >= 1", "jobs")


@dataclass(frozen=True)
class SearchTask:
    """One row's search: a picklable unit of work for an executor."""

    key: dict[str, Any]  # gpu, tp, router, instance_scheduler
    profile: Profile
    run: RunConfig  # one router, one instance scheduler
    slo: Slo
    attainment: float
    max_instances: int
    run_id: str

    @property
    def label(self) -> str:
        k = self.key
        return f"{k['gpu']}-tp{k['tp']}-{k['router']}-{k['instance_scheduler']}"


@dataclass
class SearchOutcome:
    key: dict[str, Any]
    profile: str
    points: dict[int, dict[str, Any]]  # count -> POINT_COLUMNS
    result: SearchResult | None
    not_met: str | None = None  # why the target was out of reach, when it was
    wall_s: float = 0.0


@dataclass
class Plan:
    rows: list[dict[str, Any]]
    outcomes: list[SearchOutcome]
    skipped: list[str]
    config: dict[str, Any]
    complete: bool
    wall_s: float
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per derived profile: its step-time coefficients, KV capacity and ``[source]`` (where each number came from)."""


# ------------------------------------------------------------------------------------------------ evaluation


def point_metrics(df: pl.DataFrame, slo: Slo) -> dict[str, Any]:
    """The ``POINT_COLUMNS`` of one count's request rows (one router, any number of seeds)."""
    seeds = per_seed(df, ["router"], slo).collect()
    tokens = (derive(df).group_by("seed")
              .agg(((pl.col("prompt_tokens") + pl.col("generated_tokens")).filter(completed_expr()).sum()
                    / (pl.col("finish_s").filter(completed_expr()).max() - pl.col("arrival_s").min()))
                   .alias("tokens_per_s"))
              .collect())
    out: dict[str, Any] = {"attainment": seeds["slo_attainment"].mean()}
    for col in ("goodput_per_s", "mean_e2e_s", "p99_e2e_s", "mean_ttft_s", "p99_ttft_s", "mean_tbt_s"):
        out[col] = seeds[col].mean()
    out["tokens_per_s"] = tokens["tokens_per_s"].mean()
    out["completed"] = int(seeds["completed"].sum())
    out["failed"] = int(seeds["failed"].sum())
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in out.items()}


def simulated_metrics(cfg: RunConfig, profile: Profile, run_id: str, slo: Slo) -> dict[str, Any]:
    """Simulate every unit of ``cfg`` (one router; through ``simulate``) -> point metrics."""
    frames = [out.records for out in simulate(cfg, profile, run_id)]
    return point_metrics(pl.concat(frames, how="vertical_relaxed"), slo)


def evaluate_count(task: SearchTask, instances: int) -> dict[str, Any]:
    """Simulate ``instances`` instances on every seed of the task -> point metrics."""
    return simulated_metrics(replace(task.run, instances=instances), task.profile, task.run_id, task.slo)


def run_search(task: SearchTask) -> SearchOutcome:
    """One row: the smallest count meeting the target, with every evaluated point (top level: it pickles)."""
    t0 = time.perf_counter()
    points: dict[int, dict[str, Any]] = {}

    def attainment(n: int) -> float:
        points[n] = evaluate_count(task, n)
        return points[n]["attainment"] or 0.0

    try:
        result = min_instances(attainment, task.attainment, task.max_instances)
        not_met = None
    except TargetNotMetError as exc:
        result, not_met = None, str(exc)
    return SearchOutcome(task.key, task.profile.name, dict(sorted(points.items())), result, not_met,
                         time.perf_counter() - t0)


def row_of(outcome: SearchOutcome, prices: dict[str, float] | None, price_file: str | None) -> dict[str, Any]:
    """The plan row of a search that met its target."""
    res = outcome.result
    assert res is not None
    at = outcome.points[res.instances]
    row: dict[str, Any] = {**outcome.key, "instances": res.instances, "gpus": res.instances * outcome.key["tp"],
                           "attainment": res.attainment,
                           "attainment_at_fewer": res.attainment_at_fewer}
    row.update({c: at[c] for c in POINT_COLUMNS if c != "attainment"})
    row.update(monotone=res.monotone, evaluations=len(res.points), profile=outcome.profile)
    if prices is not None:
        row.update(cost_columns(price_of(prices, outcome.key["gpu"], price_file or ""), res.instances,
                                outcome.key["tp"], at["tokens_per_s"]))
    return row


# ------------------------------------------------------------------------------------------------ the plan


def derived_profile(model: Any, gpu: Any, tp: int, dtype: str, calibration: Any = None) -> Profile:
    """The profile ``lbbench profile derive`` would write (vLLM V1, chunked prefill, ``calibration``'s factors;
    None: the shipped calibration), held in memory. ``DeriveError`` when it cannot run."""
    from ..profiling.derive import derive_profile  # lazy: start-up time (the roofline and the calibration file)

    doc = derive_profile(model, gpu, dtype=dtype, tp=tp, calibration=calibration)
    return profile_from_dict(doc, f"derived:{doc['name']}")


def tasks_for(cfg: PlanConfig, note: Callable[[str], None]) -> tuple[list[SearchTask], list[str]]:
    """Every row's search task, checked before any simulation runs, and the notes of skipped GPU x TP."""
    from ..profiling.calibration import load_calibration  # lazy: start-up time (the calibration file)
    from ..profiling.derive import DeriveError  # lazy: start-up time (the roofline and the calibration file)

    cfg.check()
    calibration = load_calibration(cfg.calibration)
    try:
        gpus = [get_gpu(g) for g in cfg.gpus]
    except UnknownGPUError as exc:
        raise PlanError(str(exc), "gpu") from None
    model = load_model_config(cfg.model)
    run = replace(cfg.run, instances=1, slo={k: v for k, v in asdict(cfg.slo).items() if v is not None},
                  timeline_interval_s=None).resolved()
    if run.live:
        raise PlanError("plans run on the simulator; no endpoints or launched servers", "endpoints")
    if run.rates:
        raise PlanError("give one arrival rate", "rates")
    run_id = uuid.uuid4().hex[:12]
    tasks, skipped = [], []
    for gpu in gpus:
        for tp in cfg.tps:
            try:
                profile = derived_profile(model, gpu, tp, cfg.dtype, calibration)
            except DeriveError as exc:
                skipped.append(f"skipping {gpu.name} at TP {tp}: {str(exc).splitlines()[0]}")
                continue
            run.check(profile)  # routers, schedulers, trace, rate: before any long work
            for router in run.routers:
                for sched in run.instance_schedulers:
                    sub = replace(run, routers=[router], instance_schedulers=[sched])
                    key = {"gpu": gpu.name, "tp": tp, "router": router, "instance_scheduler": sched}
                    tasks.append(SearchTask(key, profile, sub, cfg.slo, cfg.attainment, cfg.max_instances, run_id))
    if not tasks:
        first = skipped[0].removeprefix("skipping ")
        raise PlanError(f"{model.name} fits none of the GPU x TP combinations asked for ("
                        f"{', '.join(g.name for g in gpus)} at TP {', '.join(map(str, cfg.tps))}); {first}", "gpu")
    for msg in skipped:
        note(msg)
    return tasks, skipped


def iter_searches(tasks: list[SearchTask], jobs: int, ray: str | None) -> Iterator[SearchOutcome]:
    """Run the searches (serially, in ``jobs`` processes, or on Ray), yielding each as it completes."""
    with get_executor(jobs, ray, batch_size=1) as ex:  # a search is many simulations: one per task
        for _index, outcome in ex.submit(tasks, run_search):
            yield outcome


def plan_capacity(cfg: PlanConfig, *, note: Callable[[str], None] = lambda m: None,
                  on_outcome: Callable[[SearchOutcome], None] = lambda o: None) -> Plan:
    """Every row of the plan (see the module docstring). Rows keep the order GPU x TP x router x scheduler.

    ``on_outcome`` sees each search as it completes (the CLI writes it out). Ctrl-C ends the plan early with
    what completed and ``complete`` False. Raises ``PlanError`` (field ``max_instances``) when a row cannot
    meet the target at ``max_instances`` instances, after ``on_outcome`` has seen every search.
    """
    t0 = time.perf_counter()
    prices = load_prices(cfg.price_file) if cfg.price_file else None
    tasks, skipped = tasks_for(cfg, note)
    if prices is not None:
        for t in tasks:
            price_of(prices, t.key["gpu"], cfg.price_file or "")
    order = {tuple(t.key.values()): i for i, t in enumerate(tasks)}
    outcomes: list[SearchOutcome] = []
    complete = True
    try:
        for out in iter_searches(tasks, cfg.jobs, cfg.ray):
            outcomes.append(out)
            on_outcome(out)
    except KeyboardInterrupt:
        complete = False
    outcomes.sort(key=lambda o: order[tuple(o.key.values())])
    missed = [o for o in outcomes if o.result is None]
    if missed and complete:
        o = missed[0]
        label = f"{o.key['gpu']} TP {o.key['tp']} ({o.key['router']})"
        raise PlanError(f"{cfg.max_instances} instances are not enough for {label}: {o.not_met}; raise it, or "
                        "relax the SLO or the attainment target", "max_instances")
    rows = [row_of(o, prices, cfg.price_file) for o in outcomes if o.result is not None]
    profiles = {t.profile.name: profile_record(t.profile) for t in tasks}
    return Plan(rows, outcomes, skipped, config_record(cfg), complete, time.perf_counter() - t0, profiles)


def profile_record(p: Profile) -> dict[str, Any]:
    """A derived profile's numbers and sources, for ``plan.json``."""
    return {"hardware": p.hardware, "base_s": p.base_s, "prefill_token_s": p.prefill_token_s,
            "decode_seq_s": p.decode_seq_s, "context_token_s": p.context_token_s,
            "kv_capacity_tokens": p.kv_capacity_tokens, "max_num_seqs": p.max_num_seqs,
            "max_num_batched_tokens": p.max_num_batched_tokens, "chunked_prefill": p.chunked_prefill,
            "scheduler": p.scheduler, "step_model": "roofline" if p.roofline else "linear",
            "physics": dict(p.physics), "source": dict(p.source)}


def config_record(cfg: PlanConfig) -> dict[str, Any]:
    """What the plan asked, for ``plan.json``."""
    run = cfg.run
    return {"model": cfg.model, "gpus": list(cfg.gpus), "tps": list(cfg.tps), "dtype": cfg.dtype,
            "slo": {k: v for k, v in asdict(cfg.slo).items() if v is not None}, "attainment": cfg.attainment,
            "max_instances": cfg.max_instances, "workload": run.workload, "trace": run.trace,
            "rate_per_s": run.rate_per_s, "requests": run.requests, "seeds": run.seeds, "seed": run.seed,
            "routers": list(run.routers), "instance_schedulers": list(run.instance_schedulers),
            "predictor": run.predictor, "price_file": cfg.price_file, "calibration": cfg.calibration,
            "profiles": "derived in memory by lbbench profile derive's roofline (vLLM V1 with chunked prefill; "
                        "physics-derived with the calibration's efficiency factors, simulated; not measured on GPUs)"}


def write_outcome(out_dir: Path, outcome: SearchOutcome) -> None:
    """Append a completed search's evaluated points to ``points.jsonl`` (as it completes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    res = outcome.result
    with open(out_dir / "points.jsonl", "a") as f:
        for n, p in outcome.points.items():
            f.write(json.dumps({**outcome.key, "instances": n, **p,
                                "chosen": res is not None and n == res.instances}) + "\n")
