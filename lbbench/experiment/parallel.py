"""Simulated units on an executor: any simulated plan (routers × instance schedulers × rates × seeds) in
parallel, on local processes (``--jobs N``) or Ray (``--ray``), with the records of a serial run.

A ``SimWork`` is one unit with everything a worker needs to run it alone: the config of its rate, the
profile, the run id. ``sim_unit`` (a worker's function) builds that seed's requests — as ``iter_units`` does,
cached per worker process so that consecutive units of one seed build them once — runs ``ClusterSim`` and
returns the unit's frames. ``run_sim_units`` hands every unit to an ``lbbench.distributed`` executor and adds
the frames to the one ``RunDir`` in unit order, whatever order they finish in, so the written files are the
same as a serial run's. When the run stops early (Ctrl-C, a unit whose worker died twice), what finished is
still added before the exception goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ..core import Request
from ..profiles import Profile
from .config import RunConfig
from .rundir import RunDir, records_frame, timeline_frame
from .runner import Reporter, SimFleet, Unit, gate_note, make_router, plan, run_columns, timeline_columns
from .workload import build_requests


@dataclass(frozen=True)
class SimWork:
    """One simulated unit, self-contained (it is pickled to a worker)."""

    cfg: RunConfig  # the config of this unit's rate (a load sweep's ``cfg.sweep()`` entry)
    profile: Profile
    run_id: str
    unit: Unit
    label: str  # the unit's label, with its rate in a load sweep


@dataclass
class UnitOutput:
    records: pl.DataFrame
    timeline: pl.DataFrame | None
    notes: list[str] = field(default_factory=list)


def sim_works(cfg: RunConfig, profile: Profile, run_id: str) -> list[SimWork]:
    """Every unit of a resolved simulated config, in the order a serial run takes them (rate, variant, seed,
    router)."""
    out = []
    for c in cfg.sweep():
        suffix = f"-rate{c.rate_per_s:g}" if cfg.rates else ""
        out += [SimWork(c, profile, run_id, u, u.label + suffix) for u in plan(c)]
    return out


_requests_cache: dict[tuple, list[Request]] = {}


def _requests(work: SimWork) -> list[Request]:
    """The annotated requests of a unit's seed (the last seed's kept: a batch holds consecutive units)."""
    from ..predict import annotate, load_predictor

    cfg, v = work.cfg, work.unit.variant
    key = (repr(cfg), repr(work.profile), work.unit.seed, v.order)
    if key not in _requests_cache:
        _requests_cache.clear()
        predictor = load_predictor(cfg.predictor, profile=work.profile, seed=cfg.seed)
        _requests_cache[key] = annotate(build_requests(cfg, work.profile, work.unit.seed, v.order), predictor)
    return _requests_cache[key]


def sim_unit(work: SimWork) -> UnitOutput:
    """Run one simulated unit (an executor's function: top level, so that it pickles)."""
    cfg, profile, unit = work.cfg, work.profile, work.unit
    cols = run_columns(cfg, profile, unit.variant)
    reqs = _requests(work)
    router = make_router(cfg, profile, unit, cfg.instances, cols["chunked_prefill"])
    notes = [gate_note(unit.router, router)] if getattr(router, "heuristic_only", False) else []
    res = SimFleet(cfg, profile, unit.variant, work.run_id, cfg.instances).run(unit, reqs, router, Reporter())
    return UnitOutput(records_frame(res.records, cols), timeline_frame(res.timeline, timeline_columns(unit, cols)),
                      notes)


def run_sim_units(cfg: RunConfig, profile: Profile, run_id: str, executor: Any, run_dir: RunDir,
                  reporter: Reporter) -> None:
    """Every simulated unit of ``cfg`` on ``executor`` (``lbbench.distributed.Executor``), its frames added to
    ``run_dir`` in unit order. A ``KeyboardInterrupt`` or an executor's ``UnitError`` propagates after the
    finished units are added (the pending ones are cancelled by the executor)."""
    works = sim_works(cfg, profile, run_id)
    held: dict[int, UnitOutput] = {}
    next_index = 0
    noted: set[str] = set()
    results = executor.submit(works, sim_unit)
    try:
        for i, out in results:
            held[i] = out
            while next_index in held:
                done = held.pop(next_index)
                run_dir.add(done.records, done.timeline)
                next_index += 1
            for note in out.notes:
                if note not in noted:
                    noted.add(note)
                    reporter.note(note)
            reporter.unit_finished(works[i].label)
    finally:
        close = getattr(results, "close", None)  # a generator: closing it cancels what is pending
        if close is not None:
            close()
        for i in sorted(held):  # finished after a unit that did not: kept, in unit order
            run_dir.add(held[i].records, held[i].timeline)
