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

**Roles** (``plan --disagg``, ``lbbench.planning.disagg``): a type may carry a prefill/decode role, and the same
search finds the cheapest prefill/decode fleet. A fleet must then hold every role (at least one prefill and one
decode instance), so step 1 searches each type's count with the *other* role held at ``plenty`` instances (of
the same GPU when the other role has it), and a count held there whose one fewer missed bounds that role from
below (the miss, with the other role at ``plenty``, prunes every vector below it). Step 2 takes every vector
holding every role, costing less than the cheapest fleet step 1 met, with the capacity share taken per role
(each role must carry all of its phase's work; a type whose step 1 never met is not pruned by it, since the other
role held at ``plenty`` may be what missed); its counts are bounded by cost only (more of one role can make up for
less of the other). Step 3 never answers with a vector that drops a role: without the last prefill instance the
decode instances serve whole, which is run and reported (``still_met``: the answer is not minimal when it meets);
without the last decode instance nothing decodes (``None``).

Every vector is simulated and scored as ``lbbench plan`` scores a count (``capacity.simulated_metrics``: the one
runner, ``experiment.simulate``, with ``RunConfig.fleet`` naming the derived profiles' TOML files) on the same
seeds (paired), seed by seed with ``search.sequential_attainment``.
"""

from __future__ import annotations

import math
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

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
    role: str = "mixed"  # lbbench.fleet.ROLES

    @property
    def label(self) -> str:
        name = self.gpu if self.tp == 1 else f"{self.gpu}-tp{self.tp}"
        return name if self.role == "mixed" else f"{name}:{self.role}"

    def entry(self, count: int) -> str:
        """``count`` instances of this type as a fleet spec entry (``lbbench.fleet.parse_fleet``)."""
        return f"{self.path}:{count}" + ("" if self.role == "mixed" else f":{self.role}")

    @property
    def unit_cost(self) -> float:
        return self.tp * (1.0 if self.usd_per_gpu_hour is None else self.usd_per_gpu_hour)


@dataclass
class MixSearch:
    """One router x scheduler's answer."""

    router: str
    instance_scheduler: str
    types: list[GpuType]
    uniform: dict[str, int | None]  # type label -> smallest count meeting (None: not within max_instances); with
    # roles, with the other role held at ``plenty``
    cheapest_uniform: Vector | None
    best: Vector | None
    points: dict[Vector, float] = field(default_factory=dict)  # every simulated vector -> attainment
    fewer: dict[str, float | None] = field(default_factory=dict)  # type label -> attainment at best minus one
    # of it (None: nothing left would decode)
    mix_candidates: int = 0
    pruned_capacity: int = 0
    pruned_dominated: int = 0
    bounded: bool = False
    replaced: list[Vector] = field(default_factory=list)  # answers step 3 replaced (one fewer still met)
    wall_s: float = 0.0
    run: RunConfig | None = field(default=None, repr=False)  # what each vector ran (one router, one scheduler)
    target: float = 1.0  # the attainment to meet

    @property
    def still_met(self) -> list[str]:
        """Types one fewer of which still meets the target: without roles none (step 3 took it); with roles, a
        prefill type whose last instance's removal left decode instances serving whole that met (the answer is
        then not minimal)."""
        return [k for k, a in self.fewer.items() if a is not None and a >= self.target]

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
                "pruned_dominated": self.pruned_dominated, "bounded": self.bounded,
                "replaced": [self.spec(v) for v in self.replaced], "still_met_with_one_fewer": self.still_met,
                "wall_s": round(self.wall_s, 3),
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


def fleet_spec(types: list[GpuType], v: Vector) -> str:
    """The fleet ``v`` as ``--fleet`` writes it (``lbbench.fleet.parse_fleet``)."""
    return ",".join(t.entry(c) for c, t in zip(v, types) if c)


def fleet_attainment(run: RunConfig, types: list[GpuType], v: Vector, target: float, run_id: str) -> float:
    """The SLO attainment of the fleet ``v`` over ``run``'s paired seeds (seed by seed, stopping once the rest
    cannot change whether it meets ``target``); a stopped probe gives the bound that decided it."""
    spec, first = fleet_spec(types, v), load_profile(next(t.path for c, t in zip(v, types) if c))

    def one_seed(k: int) -> float:
        cfg = replace(run, fleet=spec, seeds=1, seed=run.seed + k).resolved()
        return simulated_metrics(cfg, first, run_id, _slo(run))["attainment"] or 0.0

    return sequential_attainment(one_seed, run.seeds, target).decided()


def _slo(run: RunConfig) -> Any:
    return Slo(**run.slo)


def roles_of(types: list[GpuType]) -> list[str]:
    """The roles the types carry, in order (``["mixed"]``: a search without prefill/decode roles)."""
    return list(dict.fromkeys(t.role for t in types))


def holds_every_role(types: list[GpuType], v: Vector) -> bool:
    """Whether ``v`` is a fleet of the search's kind: any instance without roles; with roles, at least one
    instance of each."""
    return all(any(c for c, t in zip(v, types) if t.role == r) for r in roles_of(types))


def capacity_share(types: list[GpuType], uniform: list[int | None], v: Vector, role: str,
                   max_instances: int) -> float:
    """``sum(c_t / (n_t - 1))`` over the types of ``role`` (see the module docstring); inf when a type whose
    one instance met is held, or, with roles, one whose step 1 never met (the other role held at ``plenty`` may
    have been what missed: its capacity is unknown)."""
    share = 0.0
    for c, t, n in zip(v, types, uniform):
        if not c or t.role != role:
            continue
        if n == 1 or (n is None and role != "mixed"):
            return math.inf
        share += c / ((n - 1) if n is not None else max_instances)
    return share


def _vectors_under(types: list[GpuType], tops: list[int], bound: float) -> list[Vector]:
    """Every count vector with count i in ``0..tops[i]`` costing less than ``bound`` (cost-pruned as it goes)."""
    out: list[Vector] = []

    def grow(prefix: list[int], left: float) -> None:
        i = len(prefix)
        if i == len(types):
            if left > 1e-9:
                out.append(tuple(prefix))
            return
        for c in range(tops[i] + 1):
            rest = left - c * types[i].unit_cost
            if rest <= 1e-9:
                break
            grow([*prefix, c], rest)

    grow([], bound)
    return out


def candidates(types: list[GpuType], uniform: list[int | None], bound: float, max_instances: int,
               min_capacity: float) -> tuple[list[Vector], int]:
    """Step 2's vectors costing less than ``bound``: without roles, two types or more, each count below its
    uniform count; with roles, every role held, counts bounded by cost. By increasing cost then GPUs; and how
    many the capacity share (per role) left out (see the module docstring)."""
    roles = roles_of(types)
    disagg = roles != ["mixed"]
    tops = []
    for t, n in zip(types, uniform):
        top = max_instances if n is None or disagg else n - 1
        if t.unit_cost > 0:
            top = min(top, math.ceil(bound / t.unit_cost))
        tops.append(max(0, top))
    out, pruned = [], 0
    for v in _vectors_under(types, tops, bound):
        if not (holds_every_role(types, v) if disagg else sum(1 for c in v if c) >= 2):
            continue
        if min(capacity_share(types, uniform, v, r, max_instances) for r in roles) < min_capacity:
            pruned += 1
            continue
        out.append(v)
    out.sort(key=lambda v: (sum(c * t.unit_cost for c, t in zip(v, types)), sum(c * t.tp for c, t in zip(v, types)),
                            v))
    return out, pruned


def ray_bases(types: list[GpuType], plenty: int) -> list[Vector]:
    """Step 1's base per type: nothing without roles; with roles, ``plenty`` instances of one type of every other
    role (the same GPU x TP when that role has it, else its first type)."""
    k = len(types)
    bases = []
    for t in types:
        base = [0] * k
        for r in roles_of(types):
            if r != t.role:
                same = [j for j, u in enumerate(types) if u.role == r and (u.gpu, u.tp) == (t.gpu, t.tp)]
                base[(same or [j for j, u in enumerate(types) if u.role == r])[0]] = plenty
        bases.append(tuple(base))
    return bases


def search_mix(run: RunConfig, types: list[GpuType], target: float, max_instances: int, max_evaluations: int,
               min_capacity: float, evaluate: Callable[[Vector], float] | None = None, *,
               plenty: int | None = None, on_point: Callable[[Vector, float], None] = lambda v, a: None
               ) -> MixSearch:
    """One router x scheduler (``run`` has one of each): see the module docstring. ``evaluate`` replaces the
    simulation (tests); ``plenty`` (default ``max_instances``) is the other role's count in step 1 with roles;
    ``on_point`` sees every vector as it is simulated."""
    t0 = time.perf_counter()
    run_id = uuid.uuid4().hex[:12]
    ev = evaluate or (lambda v: fleet_attainment(run, types, v, target, run_id))
    res = MixSearch(run.routers[0], run.instance_schedulers[0], types, {}, None, None, run=run, target=target)
    k = len(types)
    bases = ray_bases(types, plenty or max_instances)

    def attain(v: Vector) -> float:
        if not any(v):
            return 0.0
        if v not in res.points:
            res.points[v] = float(ev(v))
            on_point(v, res.points[v])
        return res.points[v]

    def unit(i: int, n: int) -> Vector:
        return tuple(n if j == i else c for j, c in enumerate(bases[i]))

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
    while True:  # n / n - 1 along every type the answer holds (one dropping a role is checked, never the answer)
        res.fewer = {}
        cheaper = None
        for i, t in enumerate(types):
            if best[i]:
                w = tuple(c - (j == i) for j, c in enumerate(best))
                if any(w) and not any(c for c, u in zip(w, types) if u.role != "prefill"):
                    res.fewer[t.label] = None  # nothing left decodes
                    continue
                res.fewer[t.label] = attain(w)
                if res.fewer[t.label] >= target and cheaper is None and holds_every_role(types, w):
                    cheaper = w
        if cheaper is None:
            break
        res.replaced.append(best)
        best = cheaper
    res.best = best
    res.wall_s = time.perf_counter() - t0
    return res


@dataclass
class PlanTypes:
    """A plan's checked search tasks and its GPU x TP types (derived profiles written out, prices attached)."""

    tasks: list[Any]  # capacity.SearchTask, one per GPU x TP x router x scheduler
    types: list[GpuType]
    skipped: list[str]
    priced: bool

    def router_pairs(self) -> list[tuple[str, str]]:
        """Every (router, instance scheduler), in order."""
        return list(dict.fromkeys((t.key["router"], t.key["instance_scheduler"]) for t in self.tasks))


@contextmanager
def plan_types(cfg: PlanConfig, profile_dir: Path | None, note: Callable[[str], None]) -> Iterator[PlanTypes]:
    """Check the plan, derive each GPU x TP's profile into ``profile_dir`` (else a temporary folder, removed on
    exit) and price it (``--price-file``; without one each GPU costs 1)."""
    prices = load_prices(cfg.price_file) if cfg.price_file else None
    tasks, skipped = tasks_for(cfg, note)
    keys = list(dict.fromkeys((t.key["gpu"], t.key["tp"]) for t in tasks))
    with tempfile.TemporaryDirectory(prefix="lbbench-mix-") as tmp:
        paths = write_profiles(cfg, keys, profile_dir or Path(tmp))
        types = [GpuType(g, tp, paths[(g, tp)],
                         None if prices is None else price_of(prices, g, cfg.price_file or "")) for g, tp in keys]
        yield PlanTypes(tasks, types, skipped, prices is not None)


def check_search_limits(max_evaluations: int, min_capacity: float) -> None:
    if max_evaluations < 0:
        raise PlanError(f"{max_evaluations}: must be >= 0", "max_evaluations")
    if not min_capacity >= 0:
        raise PlanError(f"{min_capacity:g}: must be >= 0", "min_capacity")


def plan_mix(cfg: PlanConfig, *, max_evaluations: int = 60, min_capacity: float = 1.0,
             profile_dir: Path | None = None, note: Callable[[str], None] = lambda m: None,
             on_search: Callable[[MixSearch], None] = lambda s: None) -> MixPlan:
    """Every router x scheduler's cheapest fleet (see the module docstring)."""
    t0 = time.perf_counter()
    check_search_limits(max_evaluations, min_capacity)
    with plan_types(cfg, profile_dir, note) as pt:
        searches = []
        for router, sched in pt.router_pairs():
            sub = replace(pt.tasks[0].run, routers=[router], instance_schedulers=[sched])
            s = search_mix(sub, pt.types, cfg.attainment, cfg.max_instances, max_evaluations, min_capacity)
            on_search(s)
            searches.append(s)
    return MixPlan(searches, pt.priced, time.perf_counter() - t0, pt.skipped)


def _money(v: float | None, priced: bool) -> str:
    if v is None:
        return "-"
    return f"${v:.2f}/h" if priced else f"{v:g} GPUs"


def fewer_text(a: float | None) -> str:
    """An attainment at one instance fewer, or why there is none."""
    return "no fleet left" if a is None else f"{100 * a:.1f} %"


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
        fewer = ", ".join(f"{k}: {fewer_text(a)}" for k, a in s.fewer.items()) or "-"
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
