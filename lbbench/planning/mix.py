"""``lbbench plan --mix``: the cheapest fleet, mixed or uniform, over GPU types that meets an SLO, per router.

A fleet is a count vector over the *types* asked for (GPU x TP, each with its derived profile); its cost is
the sum of count x TP x the GPU's price per hour (without a price file, each GPU costs 1: the cost is the
GPU count). For every router x instance scheduler:

1. **Uniform.** Each type's smallest count meeting the target (``search.min_instances``: probe, bisection,
   n meets and n - 1 misses). The cheapest of these is the cost bound ``U``.
2. **Mixes.** Every count vector with at least two types, each count below its type's uniform count, costing
   less than ``U``, in order of increasing cost (then fewer GPUs); the first one that meets the target is the
   cheapest mix searched. Skipped without simulation: a vector below (componentwise) one that missed (attainment
   is taken to grow with instances, as bisection does), and, unless ``min_capacity`` is 0, a vector whose
   *capacity share* ``sum(c_t / (n_t - 1))`` is below ``min_capacity``. Under a linear capacity model
   (``n_t - 1`` instances of type t miss because they serve less than the traffic) a share below 1 cannot
   carry the traffic; a fleet that misses for latency rather than throughput (long prompts on a slow GPU) can
   break that, so ``min_capacity`` < 1 widens the search and 0 drops the bound. ``max_evaluations`` caps the
   simulations of this step; a capped search says so (``bounded``) and keeps the cheapest fleet it found.
3. **n / n - 1.** For the answer, one instance fewer of each type it holds must miss; a cheaper vector that
   meets (a non-monotone point) replaces the answer and is checked in turn.

Every vector is simulated and scored as ``lbbench plan`` scores a count (``capacity.simulated_metrics``: the one
runner, ``experiment.simulate``, with ``RunConfig.fleet`` naming the derived profiles' TOML files) on the same
seeds (paired), seed by seed with ``search.sequential_attainment``.
"""

from __future__ import annotations

import itertools
import math
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import tomli_w
from rich.table import Table

from ..experiment import RunConfig
from ..metrics.summary import Slo
from ..profiles import load_profile
from ..profiling.gpus import get_gpu
from ..profiling.models import load_model_config
from .capacity import PlanConfig, PlanError, simulated_metrics, tasks_for
from .prices import load_prices, price_of
from .search import TargetNotMetError, min_instances, sequential_attainment

Vector = tuple[int, ...]


@dataclass(frozen=True)
class GpuType:
    gpu: str
    tp: int
    path: str  # the derived profile's TOML file
    usd_per_gpu_hour: float | None

    @property
    def label(self) -> str:
        return self.gpu if self.tp == 1 else f"{self.gpu}-tp{self.tp}"

    @property
    def unit_cost(self) -> float:
        return self.tp * (1.0 if self.usd_per_gpu_hour is None else self.usd_per_gpu_hour)


@dataclass
class MixSearch:
    """One router x scheduler's answer."""

    router: str
    instance_scheduler: str
    types: list[GpuType]
    uniform: dict[str, int | None]  # type label -> smallest count meeting (None: not within max_instances)
    cheapest_uniform: Vector | None
    best: Vector | None
    points: dict[Vector, float] = field(default_factory=dict)  # every simulated vector -> attainment
    fewer: dict[str, float] = field(default_factory=dict)  # type label -> attainment at best minus one of it
    mix_candidates: int = 0
    pruned_capacity: int = 0
    pruned_dominated: int = 0
    bounded: bool = False
    wall_s: float = 0.0

    def cost(self, v: Vector | None) -> float | None:
        return None if v is None else sum(c * t.unit_cost for c, t in zip(v, self.types))

    def gpus(self, v: Vector | None) -> int | None:
        return None if v is None else sum(c * t.tp for c, t in zip(v, self.types))

    def spec(self, v: Vector | None) -> str:
        return "-" if v is None else " + ".join(f"{c} x {t.label}" for c, t in zip(v, self.types) if c)

    def record(self) -> dict[str, Any]:
        return {"router": self.router, "instance_scheduler": self.instance_scheduler,
                "uniform": self.uniform, "cheapest_uniform": self.spec(self.cheapest_uniform),
                "cheapest_uniform_cost": self.cost(self.cheapest_uniform),
                "cheapest_uniform_gpus": self.gpus(self.cheapest_uniform),
                "best": self.spec(self.best), "best_counts": None if self.best is None else
                dict(zip([t.label for t in self.types], self.best)),
                "best_cost": self.cost(self.best), "best_gpus": self.gpus(self.best),
                "best_attainment": None if self.best is None else self.points.get(self.best),
                "attainment_with_one_fewer": self.fewer, "evaluations": len(self.points),
                "mix_candidates": self.mix_candidates, "pruned_capacity": self.pruned_capacity,
                "pruned_dominated": self.pruned_dominated, "bounded": self.bounded, "wall_s": round(self.wall_s, 3),
                "points": [{"fleet": self.spec(v), "counts": list(v), "cost": self.cost(v), "attainment": a}
                           for v, a in self.points.items()]}


@dataclass
class MixPlan:
    searches: list[MixSearch]
    priced: bool
    wall_s: float
    skipped: list[str]


def write_profiles(cfg: PlanConfig, keys: list[tuple[str, int]], where: Path) -> dict[tuple[str, int], str]:
    """Each (GPU, TP)'s derived profile as a TOML file under ``where`` (a fleet spec names profiles by path)."""
    from ..profiling.calibration import load_calibration  # lazy: start-up time (the calibration file)
    from ..profiling.derive import derive_profile  # lazy: start-up time (the roofline and the calibration file)

    model = load_model_config(cfg.model)
    calibration = load_calibration(cfg.calibration)
    where.mkdir(parents=True, exist_ok=True)
    out = {}
    for gpu, tp in keys:
        doc = derive_profile(model, get_gpu(gpu), dtype=cfg.dtype, tp=tp, calibration=calibration)
        path = where / f"{doc['name']}.toml"
        path.write_text(tomli_w.dumps(doc))
        out[(gpu, tp)] = str(path)
    return out


def fleet_attainment(run: RunConfig, types: list[GpuType], v: Vector, target: float, run_id: str) -> float:
    """The SLO attainment of the fleet ``v`` over ``run``'s paired seeds (seed by seed, stopping once the rest
    cannot change whether it meets ``target``); a stopped probe gives the bound that decided it."""
    spec = ",".join(f"{t.path}:{c}" for c, t in zip(v, types) if c)
    first = load_profile(next(t.path for c, t in zip(v, types) if c))

    def one_seed(k: int) -> float:
        cfg = replace(run, fleet=spec, seeds=1, seed=run.seed + k).resolved()
        return simulated_metrics(cfg, first, run_id, _slo(run))["attainment"] or 0.0

    return sequential_attainment(one_seed, run.seeds, target).decided()


def _slo(run: RunConfig) -> Any:
    return Slo(**run.slo)


def candidates(types: list[GpuType], uniform: list[int | None], bound: float, max_instances: int,
               min_capacity: float) -> tuple[list[Vector], int]:
    """Mixed vectors (two types or more) costing less than ``bound``, each count below its uniform count, by
    increasing cost then GPUs; and how many the capacity share left out (see the module docstring)."""
    ranges = []
    for t, n in zip(types, uniform):
        top = (n - 1) if n is not None else max_instances
        top = min(top, math.ceil(bound / t.unit_cost))
        ranges.append(range(0, max(0, top) + 1))
    out, pruned = [], 0
    for v in itertools.product(*ranges):
        if sum(1 for c in v if c) < 2:
            continue
        cost = sum(c * t.unit_cost for c, t in zip(v, types))
        if cost >= bound - 1e-9:
            continue
        share = sum(c / ((n - 1) if n is not None else max_instances) for c, n in zip(v, uniform)
                    if c and (n is None or n > 1))
        if any(c and n == 1 for c, n in zip(v, uniform)):
            share = math.inf  # cannot happen under the cost bound: one instance alone met
        if share < min_capacity:
            pruned += 1
            continue
        out.append(v)
    out.sort(key=lambda v: (sum(c * t.unit_cost for c, t in zip(v, types)), sum(c * t.tp for c, t in zip(v, types)),
                            v))
    return out, pruned


def search_mix(run: RunConfig, types: list[GpuType], target: float, max_instances: int, max_evaluations: int,
               min_capacity: float, evaluate: Callable[[Vector], float] | None = None) -> MixSearch:
    """One router x scheduler (``run`` has one of each): see the module docstring. ``evaluate`` replaces the
    simulation (tests)."""
    t0 = time.perf_counter()
    run_id = uuid.uuid4().hex[:12]
    ev = evaluate or (lambda v: fleet_attainment(run, types, v, target, run_id))
    res = MixSearch(run.routers[0], run.instance_schedulers[0], types, {}, None, None)
    k = len(types)

    def attain(v: Vector) -> float:
        if not any(v):
            return 0.0
        if v not in res.points:
            res.points[v] = float(ev(v))
        return res.points[v]

    def unit(i: int, n: int) -> Vector:
        return tuple(n if j == i else 0 for j in range(k))

    uniform: list[int | None] = []
    for i, t in enumerate(types):
        try:
            n = min_instances(lambda n, i=i: attain(unit(i, n)), target, max_instances).instances
        except TargetNotMetError:
            n = None
        uniform.append(n)
        res.uniform[t.label] = n
    met = [unit(i, n) for i, n in enumerate(uniform) if n is not None]
    if not met:
        res.wall_s = time.perf_counter() - t0
        return res
    res.cheapest_uniform = min(met, key=lambda v: (res.cost(v), res.gpus(v)))
    best = res.cheapest_uniform
    misses = [v for v, a in res.points.items() if a < target]
    cands, res.pruned_capacity = candidates(types, uniform, res.cost(best) or 0.0, max_instances, min_capacity)
    res.mix_candidates = len(cands)
    spent = 0
    for v in cands:
        if any(all(a <= b for a, b in zip(v, m)) for m in misses):
            res.pruned_dominated += 1
            continue
        if spent >= max_evaluations:
            res.bounded = True
            break
        spent += 1
        if attain(v) >= target:
            best = v
            break
        misses.append(v)
    while True:  # n / n - 1 along every type the answer holds
        res.fewer = {}
        cheaper = None
        for i, t in enumerate(types):
            if best[i]:
                w = tuple(c - (j == i) for j, c in enumerate(best))
                res.fewer[t.label] = attain(w)
                if res.fewer[t.label] >= target and cheaper is None:
                    cheaper = w
        if cheaper is None:
            break
        best = cheaper
    res.best = best
    res.wall_s = time.perf_counter() - t0
    return res


def plan_mix(cfg: PlanConfig, *, max_evaluations: int = 60, min_capacity: float = 1.0,
             profile_dir: Path | None = None, note: Callable[[str], None] = lambda m: None,
             on_search: Callable[[MixSearch], None] = lambda s: None) -> MixPlan:
    """Every router x scheduler's cheapest fleet (see the module docstring)."""
    t0 = time.perf_counter()
    if max_evaluations < 0:
        raise PlanError(f"{max_evaluations}: must be >= 0", "max_evaluations")
    if not min_capacity >= 0:
        raise PlanError(f"{min_capacity:g}: must be >= 0", "min_capacity")
    prices = load_prices(cfg.price_file) if cfg.price_file else None
    tasks, skipped = tasks_for(cfg, note)
    keys = list(dict.fromkeys((t.key["gpu"], t.key["tp"]) for t in tasks))
    with tempfile.TemporaryDirectory(prefix="lbbench-mix-") as tmp:
        paths = write_profiles(cfg, keys, profile_dir or Path(tmp))
        types = [GpuType(g, tp, paths[(g, tp)],
                         None if prices is None else price_of(prices, g, cfg.price_file or "")) for g, tp in keys]
        searches = []
        for router, sched in dict.fromkeys((t.key["router"], t.key["instance_scheduler"]) for t in tasks):
            sub = replace(tasks[0].run, routers=[router], instance_schedulers=[sched])
            s = search_mix(sub, types, cfg.attainment, cfg.max_instances, max_evaluations, min_capacity)
            on_search(s)
            searches.append(s)
    return MixPlan(searches, prices is not None, time.perf_counter() - t0, skipped)


def _money(v: float | None, priced: bool) -> str:
    if v is None:
        return "-"
    return f"${v:.2f}/h" if priced else f"{v:g} GPUs"


def print_mix(plan: MixPlan, title: str, console: Any) -> None:
    """Per router: the cheapest uniform fleet, the cheapest fleet, the saving and the search's cost; then what
    the router choice is worth."""
    table = Table(title=title)
    for name in ("router", "scheduler", "cheapest uniform", "cost", "cheapest fleet", "cost ", "GPUs", "saving",
                 "attainment", "one fewer of each", "evaluations", "wall (s)"):
        table.add_column(name, justify="left" if name in ("router", "scheduler", "cheapest uniform",
                                                          "cheapest fleet", "one fewer of each") else "right")
    for s in plan.searches:
        cu, cb = s.cost(s.cheapest_uniform), s.cost(s.best)
        saving = "-" if cu is None or cb is None or cu == 0 else f"{100 * (cu - cb) / cu:.1f} %"
        fewer = ", ".join(f"{k}: {100 * a:.1f} %" for k, a in s.fewer.items()) or "-"
        att = s.points.get(s.best) if s.best is not None else None
        table.add_row(s.router, s.instance_scheduler, s.spec(s.cheapest_uniform), _money(cu, plan.priced),
                      s.spec(s.best) + (" (capped)" if s.bounded else ""), _money(cb, plan.priced),
                      str(s.gpus(s.best) or "-"), saving, "-" if att is None else f"{100 * att:.1f} %", fewer,
                      str(len(s.points)), f"{s.wall_s:.1f}")
    console.print(table)
    for s in plan.searches:
        uni = ", ".join(f"{k} {n if n is not None else 'not met'}" for k, n in s.uniform.items())
        console.print(f"{s.router}: uniform counts {uni}; {s.mix_candidates} mixes under the uniform cost, "
                      f"{s.pruned_capacity} more left out by the capacity share, {s.pruned_dominated} below a "
                      "miss", highlight=False)
    found = [s for s in plan.searches if s.best is not None]
    if len(found) > 1:
        parts = [f"with {s.router} this traffic needs {s.gpus(s.best)} GPUs ({s.spec(s.best)}, "
                 f"{_money(s.cost(s.best), plan.priced)})" for s in found]
        console.print("; ".join(parts), highlight=False)
    console.print("[dim]Profiles are physics-derived and every fleet is simulated; one fewer of each: the "
                  "attainment with one instance fewer of each GPU type in the fleet (each must miss).[/dim]",
                  highlight=False)
