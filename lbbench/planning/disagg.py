"""``lbbench plan --disagg``: the cheapest aggregated fleet against the cheapest prefill/decode (P/D) split for
one traffic and SLO, compared at equal cost and checked by full simulated runs.

One search, ``plan --mix``'s (``mix.search_mix``), run twice over the same derived profiles and prices:

1. **Aggregated**: over the GPU x TP types, per aggregated router (``--router``): what ``plan --mix`` answers.
2. **Disaggregated**: over each type twice, as ``prefill`` and as ``decode`` (``GpuType.role``), per pair router
   (``--pd-router``), with the KV crossing ``kv_link``: the cheapest fleet holding both roles, i.e. counts and
   GPU type per role (the prefill GPU may differ from the decode GPU). Step 1 holds the other role at ``plenty``
   instances: the aggregated uniform count of that GPU (that many instances served the whole traffic, so as a
   decode pool they carry every decode), else ``max_instances``.
3. **n / n - 1 along each role** is ``search_mix``'s step 3: one instance fewer of each type the answer holds,
   prefill and decode, must miss; a P/D fleet with one fewer that still met replaced the answer (``replaced``,
   reported: the first answer was not minimal). Removing the last prefill instance leaves the decode instances
   serving whole: it is run, and when it meets the P/D answer is reported not minimal (``minimal`` False);
   removing the last decode instance leaves nothing that decodes (``None``).
4. **Check**: the cheapest fleet of each layout is run in full (every seed, no early stop, every metric:
   ``capacity.simulated_metrics``, the runner ``lbbench run`` uses) on *held-out* seeds (``seed + seeds`` on), its
   attainment reported beside the search's estimate.
5. **Equal cost**: at the cheaper layout's cost ``C``, the other layout's fleets costing at most ``C`` (``within``:
   the one of highest search attainment it simulated and, for the aggregated layout, each GPU type alone at the
   most instances ``C`` buys) are run in full the same way, and the one attaining most is reported. Goodput per
   GPU-hour = requests within the SLO per second x 3600 / GPUs; with prices, also per US dollar.

The plan picks the cheaper layout; at equal cost the one whose check attains more (then aggregated: nothing to
move between instances). Every number is
simulated on physics-derived profiles (``capacity.derived_profile``), not measured.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ..kv_links import DEFAULT_LINK, KVLinkError, parse_kv_link
from ..metrics.summary import Slo
from ..profiles import load_profile
from ..routers.registry import available_routers, is_pair_router
from .capacity import PlanConfig, PlanError, simulated_metrics
from .mix import MixSearch, Vector, check_search_limits, fleet_spec, holds_every_role, plan_types, search_mix

#: the pair router by default: lbbench's own, >= the published pair policies on 3 of 6 splits and within noise on
#: the others, and the only one that falls back to whole serving when a split is wrong (docs/disaggregation.md)
DEFAULT_PD_ROUTER = "pd_joint"


@dataclass
class Layout:
    """One layout's answer: the cheapest of its routers' searches, and the full runs that check it."""

    kind: str  # "aggregated" | "disaggregated"
    search: MixSearch
    check: dict[str, Any] | None = None  # the answer's full run on held-out seeds
    equal_cost: Vector | None = None  # its best fleet at the cheaper layout's cost (its own answer when cheaper)
    equal_cost_check: dict[str, Any] | None = None

    @property
    def best(self) -> Vector | None:
        return self.search.best

    def record(self, priced: bool) -> dict[str, Any]:
        s = self.search
        return {"kind": self.kind, "router": s.router, "fleet": s.spec(s.best), "cost": s.cost(s.best),
                "gpus": s.gpus(s.best), "counts": None if s.best is None else
                {t.label: c for t, c in zip(s.types, s.best) if c},
                "search_attainment": None if s.best is None else s.points.get(s.best),
                "attainment_with_one_fewer": s.fewer, "replaced": [s.spec(v) for v in s.replaced],
                "minimal": not s.still_met, "still_met_with_one_fewer": s.still_met,
                "check": self.check, **per_hour(self.check, s.gpus(s.best), s.cost(s.best), priced),
                "equal_cost_fleet": s.spec(self.equal_cost), "equal_cost_cost": s.cost(self.equal_cost),
                "equal_cost_check": self.equal_cost_check,
                **{f"equal_cost_{k}": v for k, v in per_hour(self.equal_cost_check, s.gpus(self.equal_cost),
                                                             s.cost(self.equal_cost), priced).items()}}


@dataclass
class DisaggPlan:
    aggregated: list[MixSearch] = field(default_factory=list)
    disaggregated: list[MixSearch] = field(default_factory=list)
    layouts: dict[str, Layout] = field(default_factory=dict)
    chosen: str | None = None
    priced: bool = False
    kv_link: str = DEFAULT_LINK
    complete: bool = False
    wall_s: float = 0.0
    skipped: list[str] = field(default_factory=list)


def per_hour(check: dict[str, Any] | None, gpus: int | None, cost: float | None, priced: bool) -> dict[str, Any]:
    """Goodput per GPU-hour (and per US dollar with prices) of a full run."""
    good = None if check is None else check.get("goodput_per_s")
    out: dict[str, Any] = {"goodput_per_gpu_hour": None if good is None or not gpus else good * 3600 / gpus}
    if priced:
        out["goodput_per_usd"] = None if good is None or not cost else good * 3600 / cost
    return out


def check_pd_routers(names: list[str]) -> None:
    if not names:
        raise PlanError("give a prefill/decode pair router", "pd_routers")
    for n in names:
        if not is_pair_router(n):
            pairs = ", ".join(r for r in available_routers() if is_pair_router(r))
            raise PlanError(f"{n!r} is not a prefill/decode pair router (choose from {pairs})", "pd_routers")


def cheapest(searches: list[MixSearch]) -> MixSearch | None:
    found = [s for s in searches if s.best is not None]
    return min(found, key=lambda s: (s.cost(s.best), s.gpus(s.best))) if found else None


def full_run(s: MixSearch, v: Vector) -> dict[str, Any]:
    """``v`` run with every metric on as many held-out seeds as its search ran (``seed + seeds`` on)."""
    run = s.run
    assert run is not None
    cfg = replace(run, fleet=fleet_spec(s.types, v), seed=run.seed + run.seeds).resolved()
    first = load_profile(next(t.path for c, t in zip(v, s.types) if c))
    return simulated_metrics(cfg, first, uuid.uuid4().hex[:12], Slo(**run.slo))


def within(s: MixSearch, budget: float) -> list[Vector]:
    """The fleets of its kind (every role held) to try at cost <= ``budget``: the simulated one of highest search
    attainment (then the dearer), and, without roles, each type alone at the most instances the budget buys."""
    fits = [v for v in s.points if (s.cost(v) or 0.0) <= budget + 1e-9 and holds_every_role(s.types, v)]
    out = [max(fits, key=lambda v: (s.points[v], s.cost(v) or 0.0))] if fits else []
    for i, t in enumerate(s.types):
        n = int((budget + 1e-9) // t.unit_cost) if t.role == "mixed" and t.unit_cost > 0 else 0
        v = tuple(n if j == i else 0 for j in range(len(s.types)))
        if n and v not in out:
            out.append(v)
    return out


def plan_disagg(cfg: PlanConfig, *, pd_routers: list[str], kv_link: str = DEFAULT_LINK, max_evaluations: int = 60,
                min_capacity: float = 1.0, profile_dir: Path | None = None,
                note: Callable[[str], None] = lambda m: None,
                on_point: Callable[[str, str, str, Vector, float], None] = lambda *a: None,
                on_search: Callable[[str, MixSearch], None] = lambda k, s: None) -> DisaggPlan:
    """The aggregated and the P/D answer, checked and compared (see the module docstring). ``on_point(kind,
    router, fleet spec, vector, attainment)`` sees every simulated fleet as it completes; Ctrl-C returns what completed
    with ``complete`` False."""
    t0 = time.perf_counter()
    check_search_limits(max_evaluations, min_capacity)
    check_pd_routers(pd_routers)
    try:
        parse_kv_link(kv_link)
    except KVLinkError as exc:
        raise PlanError(str(exc).removeprefix("kv_link: "), "kv_link") from None
    plan = DisaggPlan(kv_link=kv_link)
    with plan_types(cfg, profile_dir, note) as pt:
        plan.priced, plan.skipped = pt.priced, pt.skipped
        base = pt.tasks[0].run
        try:
            _search(plan, cfg, pt, base, pd_routers, kv_link, max_evaluations, min_capacity, on_point, on_search)
            _check(plan)
            plan.complete = True
        except KeyboardInterrupt:
            plan.complete = False
    plan.wall_s = time.perf_counter() - t0
    return plan


def _search(plan: DisaggPlan, cfg: PlanConfig, pt: Any, base: Any, pd_routers: list[str], kv_link: str,
            max_evaluations: int, min_capacity: float, on_point: Callable[..., None],
            on_search: Callable[[str, MixSearch], None]) -> None:
    def watch(kind: str, router: str) -> Callable[[Vector, float], None]:
        return lambda v, a: on_point(kind, router, fleet_spec(types_of[kind], v), v, a)

    pd_types = [replace(t, role=r) for r in ("prefill", "decode") for t in pt.types]
    types_of = {"aggregated": pt.types, "disaggregated": pd_types}
    for router, sched in pt.router_pairs():
        sub = replace(base, routers=[router], instance_schedulers=[sched])
        s = search_mix(sub, pt.types, cfg.attainment, cfg.max_instances, max_evaluations, min_capacity,
                       on_point=watch("aggregated", router))
        plan.aggregated.append(s)
        on_search("aggregated", s)
    uniform = [n for s in plan.aggregated for n in s.uniform.values() if n is not None]
    plenty = min(cfg.max_instances, max(uniform)) if uniform else cfg.max_instances
    for router in pd_routers:
        for sched in dict.fromkeys(sched for _, sched in pt.router_pairs()):
            sub = replace(base, routers=[router], instance_schedulers=[sched], kv_link=kv_link).resolved()
            s = search_mix(sub, pd_types, cfg.attainment, cfg.max_instances, max_evaluations, min_capacity,
                           plenty=plenty, on_point=watch("disaggregated", router))
            plan.disaggregated.append(s)
            on_search("disaggregated", s)


def _check(plan: DisaggPlan) -> None:
    for kind, searches in (("aggregated", plan.aggregated), ("disaggregated", plan.disaggregated)):
        s = cheapest(searches)
        if s is not None:
            plan.layouts[kind] = Layout(kind, s, full_run(s, s.best))
    if not plan.layouts:
        return
    costs = {k: lay.search.cost(lay.best) or 0.0 for k, lay in plan.layouts.items()}
    checked = {k: (lay.check or {}).get("attainment") or 0.0 for k, lay in plan.layouts.items()}
    plan.chosen = min(costs, key=lambda k: (costs[k], -checked[k], k != "aggregated"))
    budget = costs[plan.chosen]
    for kind, lay in plan.layouts.items():
        if kind == plan.chosen:
            lay.equal_cost, lay.equal_cost_check = lay.best, lay.check
            continue
        runs = [(v, full_run(lay.search, v)) for v in within(lay.search, budget)]
        if runs:
            lay.equal_cost, lay.equal_cost_check = max(
                runs, key=lambda r: ((r[1].get("attainment") or 0.0), r[1].get("goodput_per_s") or 0.0))
