"""One runner for every ``lbbench run``: the plan (variants × seeds × routers) on a simulated or a live backend.

``run_experiment`` walks the plan once, whatever the backend:

    for each unit (rate × variant × seed × router, in that order), on the backend's executor:
        the one unit body (``units.run_unit``): the seed's requests with their predicted lengths (paired:
        every router sees the same ones), the router, the run on the backend's fleet -> records + timeline
    the frames go to the run directory in unit order, whatever order the units finish in

A simulated run's units may run here, on a process pool or on Ray tasks (an ``lbbench.distributed`` executor)
with the same records; a live run's run here one after the other (``lbbench.experiment.backends``).
``simulate`` gives a simulated config's frames without a run directory (capacity planning, bench scripts).

Progress and notes go to a ``Reporter`` (the CLI's renders them with rich); errors are ``ConfigError`` and the
other library errors, never printed here.
"""

from __future__ import annotations

import datetime as _dt
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import polars as pl

from ..distributed import Executor, SerialExecutor, UnitError
from ..profiles import Profile, load_profile
from ..rundir import RunDir
from .backends import SimBackend, backend_for
from .config import RunConfig, workload_label
from .resume import load_resume
from .units import Reporter, UnitOutput, Work, saturation_line, works


def default_out_dir(cfg: RunConfig) -> Path:
    """``runs/<timestamp>-<workload>``: where a run goes when no directory is given."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{workload_label(cfg).replace(':', '-').replace('/', '-')}"


def run_units(units: Sequence[Work], run: Callable[[Work], UnitOutput], executor: Executor,
              add: Callable[[Work, UnitOutput], None], reporter: Reporter) -> bool:
    """``run`` on every unit on ``executor``, each output handed to ``add`` in unit order; after a unit that
    did not complete the rest are not run and False is returned. A ``KeyboardInterrupt`` or an executor's
    ``UnitError`` propagates after the units that finished are added (the pending ones are cancelled by the
    executor)."""
    held: dict[int, UnitOutput] = {}
    next_index = 0
    noted: set[str] = set()
    results = executor.submit(units, run)
    try:
        for i, out in results:
            held[i] = out
            stop = False
            while next_index in held and not stop:
                done = held.pop(next_index)
                add(units[next_index], done)
                next_index += 1
                stop = not done.complete
            for note in out.notes:
                if note not in noted:
                    noted.add(note)
                    reporter.note(note)
            reporter.unit_finished(units[i].label)
            if stop:
                held.clear()  # what came after an incomplete unit is not kept
                return False
        return True
    finally:
        close = getattr(results, "close", None)  # a generator: closing it cancels what is pending
        if close is not None:
            close()
        for i in sorted(held):  # finished after a unit that did not: kept, in unit order
            add(units[i], held[i])


def simulate(cfg: RunConfig, profile: Profile, run_id: str, executor: Executor | None = None
             ) -> list[UnitOutput]:
    """Every simulated unit of ``cfg`` (as given: not resolved here), in unit order, on ``executor``
    (default: here)."""
    outputs: list[UnitOutput] = []
    run_units(works(cfg, profile, run_id), SimBackend().run, executor or SerialExecutor(),
              lambda _work, out: outputs.append(out), Reporter())
    return outputs


@dataclass
class RunOutcome:
    summary: pl.DataFrame
    complete: bool
    path: Path
    run_id: str


def run_experiment(cfg: RunConfig, out_dir: Path | str, *, profile: Profile | None = None,
                   reporter: Reporter | None = None, run_id: str | None = None,
                   executor: Executor | None = None, resume: bool = False) -> RunOutcome:
    """Run a whole experiment into ``out_dir`` and return its summary.

    ``cfg`` is resolved and checked first. Simulated units run on ``executor`` (an
    ``lbbench.distributed.Executor``, which the caller closes; default: a process pool of ``cfg.jobs``
    processes when that is over 1, else this process); the records do not depend on where they ran. A live
    run replays from this process whatever the executor. Ctrl-C, a live replay that did not complete, or a
    live instance that died between units end the run early: everything measured is kept and ``run.toml``
    says ``complete = false``. A unit whose worker died twice (``lbbench.distributed.UnitError``) does the
    same, then the error is raised.

    ``resume``: ``out_dir`` holds an interrupted run of the same units (``lbbench.experiment.resume``; a
    ``ConfigError`` names a setting that differs): its complete units are kept, the others run, and every unit is
    written in unit order under the run's own id.
    """
    cfg = cfg.resolved()
    profile = profile or load_profile(cfg.profile)
    cfg.check(profile)
    reporter = reporter or Reporter()
    resumed = load_resume(out_dir, cfg, profile) if resume else None
    run_id = (resumed.run_id if resumed else None) or run_id or uuid.uuid4().hex[:12]
    rd = RunDir(out_dir, cfg, profile, run_id, cfg.fleet_of(profile))
    kept = resumed.units if resumed else {}
    every = works(cfg, profile, run_id)
    todo = [w for w in every if w.label not in kept]
    if resumed:
        reporter.note(f"resuming {rd.path}: {len(every) - len(todo)} of {len(every)} units complete, "
                      f"running {len(todo)}")
    rd.start()
    t0 = time.perf_counter()
    backend = backend_for(cfg, profile, rd, reporter)
    runs_on = backend.executor(executor)
    complete = False
    ran: dict[str, UnitOutput] = {}
    failure: UnitError | None = None
    try:
        complete = run_units(todo, backend.run, runs_on, lambda work, out: ran.__setitem__(work.label, out),
                             reporter)
    except KeyboardInterrupt:
        pass
    except UnitError as exc:
        reporter.note(f"stopping: {exc}", warning=True)
        failure = exc
    except backend.stopping_errors as exc:
        if not ran and not kept:  # nothing measured yet: the endpoints were never usable
            raise
        reporter.note(f"stopping: {exc}", warning=True)  # an instance died between units
    finally:
        backend.close()
        if runs_on is not executor:
            runs_on.close()
    line = saturation_line([ran[w.label].saturation for w in every
                            if w.label in ran and ran[w.label].saturation is not None])
    if line:
        reporter.note(line)
    for work in every:  # unit order, kept and new units alike
        if work.label in kept:
            rd.add(*kept[work.label], unit=work.label)
        elif work.label in ran:
            out = ran[work.label]
            rd.add(out.records, out.timeline, out.decisions, unit=work.label, complete=out.complete)
    extra: dict[str, Any] = {"wall_s": round(time.perf_counter() - t0, 3), **backend.describe(runs_on)}
    if resumed:
        extra["resumed_units"] = len(every) - len(todo)
    if failure is not None:
        extra["error"] = str(failure)
    summary = rd.finish(complete, extra)
    if failure is not None:
        raise failure
    return RunOutcome(summary, complete, rd.path, run_id)
