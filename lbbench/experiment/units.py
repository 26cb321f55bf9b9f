"""The plan of a run and the one body that runs a unit of it, simulated or live.

A ``Unit`` is one router on one seed of one variant (arrival order × instance scheduler × chunked prefill); a
``Work`` is a unit with everything needed to run it alone — the config of its rate (a load sweep's
``cfg.sweep()`` entry), the profile, the run id — so that it can be pickled to a worker. ``works(cfg, ...)``
lists every unit in run order (rate, variant, seed, router).

``run_unit(work, fleet, reporter)`` is the only code that runs a unit: it builds and annotates the seed's
requests (cached per process, so that consecutive units of one seed build them once, and every router of a seed
sees the very same requests), makes the unit's router, notes a learned router that routes with its guidance
heuristic, runs the unit on the ``Instances`` a backend gives it (``lbbench.experiment.backends``) and builds the
unit's frames. A simulated unit's records are in memory and its frame is too; a live unit's were streamed to disk
as its requests ended (``lbbench.rundir.records``) and its frame stays lazy, a scan of them: the run
directory writes ``requests.parquet`` from it without holding the records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import polars as pl

from ..core import RECORD_FIELDS, Request, RequestRecord
from ..fleet import Fleet
from ..predict import Predictor, annotate, load_predictor
from ..profiles import Profile
from ..routers import get_router
from ..rundir import records_frame, timeline_frame
from ..workloads.prefix_reuse import ReuseIntent, declares_reuse, reuse_intent
from .config import LEARNED_ROUTERS, RunConfig, Variant, workload_label
from .decisions import DecisionRecorder
from .workload import build_requests


class Reporter:
    """Where a run says how it goes (no-ops here; the CLI draws progress bars)."""

    def unit_started(self, label: str, total: int) -> None: ...
    def unit_progress(self, label: str, done: int, total: int) -> None: ...
    def unit_finished(self, label: str) -> None: ...
    def note(self, message: str, warning: bool = False) -> None: ...


@dataclass(frozen=True)
class Unit:
    """One router on one seed of one variant: the smallest thing a backend runs."""

    variant: Variant
    seed: int
    router: str
    label: str


def unit_label(cfg: RunConfig, v: Variant, seed: int, router: str) -> str:
    """``router-seedN[-ORDER][-SCHEDULER][-chunked-on|off]``: a unit's name (and its partial-records folder)."""
    parts = [f"{router}-seed{seed}"]
    if v.order:
        parts.append(v.order)
    if len(cfg.instance_schedulers) > 1:
        parts.append(v.instance_scheduler)
    if v.chunked_prefill is not None:
        parts.append(f"chunked-{'on' if v.chunked_prefill else 'off'}")
    return "-".join(parts)


def plan_all(cfg: RunConfig) -> list[Unit]:
    """Every unit of a (resolved) config, a load sweep's rates included (rate by rate)."""
    return [u for c in cfg.sweep() for u in plan(c)]


def plan(cfg: RunConfig) -> list[Unit]:
    """Every unit of a (resolved) config, in run order."""
    return [Unit(v, seed, name, unit_label(cfg, v, seed, name))
            for v in cfg.variants() for seed in cfg.seed_list() for name in cfg.routers]


@dataclass(frozen=True)
class Work:
    """One unit, self-contained (it is pickled to a worker)."""

    cfg: RunConfig  # the config of this unit's rate (a load sweep's ``cfg.sweep()`` entry)
    profile: Profile  # the first instance's: what routers are constructed with (capacity-aware ones read specs)
    run_id: str
    unit: Unit
    label: str  # the unit's label, with its rate in a load sweep
    fleet: Fleet | None = None  # one profile per instance (None: ``cfg.instances`` x ``profile``)

    def instance_profiles(self) -> list[Profile]:
        """One profile per instance, in instance order."""
        return self.fleet.profiles() if self.fleet is not None else [self.profile] * self.cfg.instances


def works(cfg: RunConfig, profile: Profile, run_id: str) -> list[Work]:
    """Every unit of ``cfg`` as ``Work``, in run order (rate, variant, seed, router); each carries the fleet
    (``cfg.fleet_of(profile)``)."""
    fleet = cfg.fleet_of(profile)
    out = []
    for c in cfg.sweep():
        suffix = f"-rate{c.rate_per_s:g}" if cfg.rates else ""
        out += [Work(c, profile, run_id, u, u.label + suffix, fleet) for u in plan(c)]
    return out


def run_columns(cfg: RunConfig, profile: Profile, v: Variant, fleet: Fleet | None = None) -> dict[str, Any]:
    """The run-level columns of every request row of a variant (``profile``: the profile's name, or a mixed
    fleet's label, ``a100x2+l4x2``; chunked prefill: the first instance's when the variant does not set it)."""
    chunked = profile.chunked_prefill if v.chunked_prefill is None else v.chunked_prefill
    name = fleet.label if fleet is not None and not fleet.is_uniform else profile.name
    return {
        "profile": name, "workload": workload_label(cfg), "num_instances": cfg.instances,
        "instance_scheduler": v.instance_scheduler, "chunked_prefill": bool(chunked),
        "order": v.order, "rate_per_s": cfg.rate_per_s, "backend": cfg.backend,
    }


def timeline_columns(unit: Unit, cols: dict[str, Any]) -> dict[str, Any]:
    return {"router": unit.router, "seed": unit.seed, "order": unit.variant.order,
            "instance_scheduler": unit.variant.instance_scheduler, "chunked_prefill": cols["chunked_prefill"],
            "rate_per_s": cols["rate_per_s"]}


@dataclass
class UnitResult:
    """What a fleet measured of one unit."""

    #: in memory (simulated), or streamed to disk and scanned lazily (live: the ``requests.parquet`` columns,
    #: then any of their own, e.g. load workers' ``load_worker`` and ``clock_offset_s``)
    records: list[RequestRecord] | pl.LazyFrame
    #: per-instance samples: (time_s, instance, running, waiting, kv_usage, preemptions[, prefix hit rate])
    timeline: Sequence[tuple] | pl.DataFrame = ()
    complete: bool = True
    #: when the unit's backlog saturated (``lbbench.live.saturation``; run clock), else None
    saturated_at_s: float | None = None
    #: live: sending stopped when it saturated
    saturation_stopped: bool = False


@dataclass
class UnitOutput:
    """One unit's frames, as the run directory takes them."""

    #: lazy when the unit's records were streamed to disk (live)
    records: pl.DataFrame | pl.LazyFrame
    timeline: pl.DataFrame | None
    complete: bool = True
    notes: list[str] = field(default_factory=list)
    #: the unit's ``decisions.parquet`` rows (``RunConfig.decisions``), else None
    decisions: pl.DataFrame | None = None
    #: when its backlog kept growing; the run says so in one line for all its units (``saturation_line``)
    saturation: Saturation | None = None


class Instances(Protocol):
    """The instances a unit runs on (simulated instances; attached endpoints; or launched vLLM servers)."""

    num_instances: int

    def prepare(self, requests: list[Request]) -> None:
        """Called before each unit with its seed's requests (live: build their text prompts, once per seed)."""

    def run(self, work: Work, requests: list[Request], router: Any, reporter: Reporter) -> UnitResult: ...


def gate_note(name: str, router: Any) -> str:
    """What to tell a user whose learned router's checkpoint routes with its guidance heuristic
    (the network did not beat it on the validation gate's workloads), so that no one reads the
    heuristic's numbers as the network's."""
    v = router.policy.meta.get("validation") or {}
    fallback = router.policy.meta.get("fallback")  # a deployable teacher routes instead of the mixing penalty
    mismatch = getattr(router, "scheduler_mismatch", None)
    if mismatch and router.policy.meta.get("gate") != "heuristic":
        seen = (f": its network was trained against {mismatch[0]} engines and the run's are {mismatch[1]} "
                "(train one with --instance-scheduler)")
    else:
        seen = (f": on its validation workloads the network gave {v['network_e2e_s']:.1f} s mean E2E, "
                f"{fallback or 'the heuristic'} {v['heuristic_e2e_s']:.1f} s" if v else "")
    how = f"its fallback router {fallback}" if fallback else "its guidance heuristic (least mixing penalty)"
    return (f"{name}: checkpoint {router.checkpoint} routes with {how}"
            f"{seen}; --router-opt {name}.gate=false routes with the network")


def make_router(cfg: RunConfig, profile: Profile, unit: Unit, num_instances: int, chunked_prefill: bool) -> Any:
    """The router of one unit, with its options (a learned router's checkpoint for the engine mode).

    ``profile`` is the first instance's: routers that take one profile assume it of every instance; a
    capacity-aware router reads each instance's ``InstanceSpec`` (KV tokens, ``max_num_seqs``, speed), which
    the fleet gives it, instead."""
    opts = dict(cfg.router_options.get(unit.router, {}))
    if unit.router in ENGINE_ORDER_ROUTERS:  # a feature follows the engine's order of service
        opts.setdefault("instance_scheduler", unit.variant.instance_scheduler)
    if unit.router in LEARNED_ROUTERS:
        if "checkpoint" not in opts:
            opts["chunked_prefill"] = chunked_prefill  # picks the engine mode's checkpoint
        opts.setdefault("instance_scheduler", unit.variant.instance_scheduler)  # the scheduler guard
    return get_router(unit.router, num_instances=num_instances, seed=unit.seed, profile=profile, **opts)


#: routers told the unit's instance scheduler (a feature of theirs follows the engine's order of service)
ENGINE_ORDER_ROUTERS = ("predicted_latency",)

#: the last seed's annotated requests and the last predictor, per process (a worker runs consecutive units)
_requests_cache: dict[tuple, list[Request]] = {}
_predictor_cache: dict[tuple, Predictor] = {}


def seed_requests(work: Work) -> list[Request]:
    """The annotated requests of a unit's seed: the same list for every unit of that seed in this process."""
    cfg, v = work.cfg, work.unit.variant
    key = (repr(cfg), repr(work.profile), work.unit.seed, v.order)
    if key not in _requests_cache:
        _requests_cache.clear()
        pkey = (cfg.predictor, repr(work.profile), cfg.seed)
        if pkey not in _predictor_cache:
            _predictor_cache.clear()
            _predictor_cache[pkey] = load_predictor(cfg.predictor, profile=work.profile, seed=cfg.seed)
        _requests_cache[key] = annotate(build_requests(cfg, work.profile, work.unit.seed, v.order),
                                        _predictor_cache[pkey])
    return _requests_cache[key]


def instance_profile(profiles: Sequence[Profile]) -> pl.Expr:
    """``instance_profile``: the profile name of the instance each request went to (null for a request never
    dispatched)."""
    names = [p.name for p in profiles]
    return pl.col("instance").replace_strict(list(range(len(names))), names, default=None,
                                             return_dtype=pl.Utf8).alias("instance_profile")


def unit_frame(records: pl.LazyFrame, cols: dict[str, Any], profiles: Sequence[Profile]) -> pl.LazyFrame:
    """A unit's ``requests.parquet`` rows: the record columns, the run-level columns ``cols``, ``instance_profile``,
    then the records' own further columns (live load workers: ``load_worker``, ``clock_offset_s``)."""
    own = [c for c in records.collect_schema().names() if c not in RECORD_FIELDS]
    return records.with_columns([pl.lit(v).alias(k) for k, v in cols.items()]).select(
        *RECORD_FIELDS, *cols, instance_profile(profiles), *own)


@dataclass(frozen=True)
class Saturation:
    """A unit whose backlog kept growing (``lbbench.live.saturation``): when, and what the run did about it."""

    router: str
    seed: int
    #: the unit's label without its router and seed (its variant and a load sweep's rate; "" for none)
    group: str
    at_s: float
    #: live: sending stopped (else only marked, as the simulator does)
    stopped: bool
    #: requests not sent or cancelled when sending stopped
    unsent: int


def mark_saturation(frame: pl.LazyFrame, work: Work, res: UnitResult) -> tuple[pl.LazyFrame, Saturation | None]:
    """``frame`` with the unit's ``saturated`` (bool) and ``saturated_at_s`` columns, and what saturated."""
    at = res.saturated_at_s
    frame = frame.with_columns(pl.lit(at is not None).alias("saturated"),
                               pl.lit(at, dtype=pl.Float64).alias("saturated_at_s"))
    if at is None:
        return frame, None
    saturated = pl.col("error").is_not_null() & pl.col("error").str.ends_with(": saturated")
    unsent = frame.filter(saturated).select(pl.len()).collect().item()
    unit = work.unit
    group = work.label.removeprefix(f"{unit.router}-seed{unit.seed}").lstrip("-")
    return frame, Saturation(unit.router, unit.seed, group, at, res.saturation_stopped, unsent)


def _seeds_text(seeds: Sequence[int]) -> str:
    """``seed 3``, ``seeds 0, 2`` or ``seeds 0-9`` (a run of three or more consecutive seeds as a range)."""
    xs = sorted(set(seeds))
    if len(xs) == 1:
        return f"seed {xs[0]}"
    parts: list[str] = []
    start = prev = xs[0]
    for x in [*xs[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        parts.append(f"{start}-{prev}" if prev - start >= 2 else ", ".join(map(str, range(start, prev + 1))))
        if x is not None:
            start = prev = x
    return "seeds " + ", ".join(parts)


def saturation_line(marks: Sequence[Saturation]) -> str | None:
    """The one line that says which units of a run saturated (None when none did): when, what was done, and per
    variant (and rate) the routers with their seeds, routers that saturated on the same seeds named together."""
    if not marks:
        return None
    lo, hi = min(m.at_s for m in marks), max(m.at_s for m in marks)
    when = f"{lo:.1f} s" if hi - lo < 0.05 else f"{lo:.1f}-{hi:.1f} s"
    unsent = sum(m.unsent for m in marks)
    what = (f"sending stopped, {unsent} requests not sent or cancelled" if any(m.stopped for m in marks)
            else "marked, not stopped")
    groups: dict[str, dict[str, list[int]]] = {}
    for m in marks:
        groups.setdefault(m.group, {}).setdefault(m.router, []).append(m.seed)
    items = []
    for group, routers in groups.items():
        by_seeds: dict[str, list[str]] = {}
        for router, seeds in routers.items():
            by_seeds.setdefault(_seeds_text(seeds), []).append(router)
        text = "; ".join(f"{', '.join(names)} ({seeds})" for seeds, names in by_seeds.items())
        items.append(f"{group}: {text}" if group else text)
    return f"saturated (the backlog kept growing) at {when}, {what}: " + " | ".join(items)


#: the reuse intent of the last seed's requests, per process (keyed by the requests list's identity)
_intent_cache: dict[int, tuple[list[Request], ReuseIntent]] = {}


def mark_reuse_intent(frame: pl.LazyFrame, cfg: RunConfig, profile: Profile, reqs: list[Request]) -> pl.LazyFrame:
    """``frame`` with the seed's ``intended_prefix_hit_rate`` and ``reuse_intended`` (``lbbench.metrics.prefix_check``),
    at the engine's block size."""
    hit = _intent_cache.get(id(reqs))
    if hit is None or hit[0] is not reqs:
        _intent_cache.clear()
        declared = not cfg.trace and declares_reuse(cfg.workload)
        hit = _intent_cache[id(reqs)] = (reqs, reuse_intent(reqs, profile.block_size, declared))
    intent = hit[1]
    return frame.with_columns(pl.lit(intent.intended_rate, dtype=pl.Float64).alias("intended_prefix_hit_rate"),
                              pl.lit(intent.intends_reuse).alias("reuse_intended"))


def mark_tenants(frame: pl.LazyFrame, reqs: list[Request]) -> pl.LazyFrame:
    """``frame`` with each request's ``tenant`` and ``priority_band`` (flow control's flow key)."""
    ids = [r.request_id for r in reqs]
    return frame.with_columns(
        pl.col("request_id").replace_strict(ids, [r.tenant for r in reqs], default=None,
                                            return_dtype=pl.Utf8).alias("tenant"),
        pl.col("request_id").replace_strict(ids, [r.priority_band for r in reqs], default=None,
                                            return_dtype=pl.Int64).alias("priority_band"))


def run_unit(work: Work, fleet: Instances, reporter: Reporter) -> UnitOutput:
    """Run one unit on ``fleet``: its seed's requests, its router, the gate note, the records' frames."""
    cfg, profile, unit = work.cfg, work.profile, work.unit
    cols = run_columns(cfg, profile, unit.variant, work.fleet)
    reqs = seed_requests(work)
    fleet.prepare(reqs)
    router = make_router(cfg, profile, unit, fleet.num_instances, cols["chunked_prefill"])
    notes = [gate_note(unit.router, router)] if getattr(router, "heuristic_only", False) else []
    recorder = None
    if cfg.decisions or cfg.counterfactual:
        router = recorder = DecisionRecorder(
            router, cfg.counterfactual or 0, cfg.counterfactual_every,
            factory=lambda: make_router(cfg, profile, unit, fleet.num_instances, cols["chunked_prefill"]))
    reporter.unit_started(work.label, len(reqs))
    res = fleet.run(work, reqs, router, reporter)
    notes += [str(n) for n in getattr(router, "run_notes", lambda: [])()]  # e.g. an online model still cold
    streamed = isinstance(res.records, pl.LazyFrame)
    records = res.records if streamed else records_frame(res.records, {}).lazy()
    frame, saturation = mark_saturation(unit_frame(records, cols, work.instance_profiles()), work, res)
    frame = mark_reuse_intent(frame, cfg, profile, reqs)
    if cfg.tenants is not None:
        frame = mark_tenants(frame, reqs)
    decisions = None if recorder is None else recorder.frame(
        {"run_id": work.run_id, "unit": work.label, **timeline_columns(unit, cols)})
    timeline = timeline_frame(res.timeline, timeline_columns(unit, cols))
    return UnitOutput(frame if streamed else frame.collect(), timeline, res.complete, notes, decisions=decisions,
                      saturation=saturation)
