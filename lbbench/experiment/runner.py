"""One runner for every ``lbbench run``: the plan (variants × seeds × routers) on a simulated or a live backend.

``run_experiment`` walks the plan once, whatever the backend:

    for each variant (arrival order × instance scheduler × chunked prefill):
        open the backend's fleet for it (simulated instances; attached endpoints; or launched vLLM servers)
        for each seed: build the requests, predict their lengths (paired: every router sees the same ones)
            for each router: run the unit on the fleet -> records + timeline, added to the run directory

A backend differs only in ``fleet(variant)`` and ``Fleet.run``: ``SimBackend`` runs ``ClusterSim`` in virtual
time, ``LiveBackend`` drives the same ``Dispatcher`` over HTTP (``lbbench.harness.replay``). Both give routers
the profile's ``InstanceSpec`` (live: with the KV capacity the engine reports), both build records with
``RequestRecord.for_request`` under the unit's router label, and both yield the same frames to ``RunDir``.
Simulated units may run elsewhere — a process pool or Ray tasks (``lbbench.experiment.parallel`` on an
``lbbench.distributed`` executor) — with the same records as one after the other here.

Progress and notes go to a ``Reporter`` (the CLI's renders them with rich); errors are ``ConfigError`` and the
other library errors, never printed here.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Protocol, Sequence

import polars as pl

from ..core import InstanceSpec, Request, RequestRecord
from ..profiles import Profile
from .config import LEARNED_ROUTERS, RunConfig, Variant, workload_label
from .rundir import RunDir, records_frame, timeline_frame
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


def run_columns(cfg: RunConfig, profile: Profile, v: Variant) -> dict[str, Any]:
    """The run-level columns of every request row of a variant."""
    chunked = profile.chunked_prefill if v.chunked_prefill is None else v.chunked_prefill
    return {
        "profile": profile.name, "workload": workload_label(cfg), "num_instances": cfg.instances,
        "instance_scheduler": v.instance_scheduler, "chunked_prefill": bool(chunked),
        "order": v.order, "rate_per_s": cfg.rate_per_s, "backend": cfg.backend,
    }


def timeline_columns(unit: Unit, cols: dict[str, Any]) -> dict[str, Any]:
    return {"router": unit.router, "seed": unit.seed, "order": unit.variant.order,
            "instance_scheduler": unit.variant.instance_scheduler, "chunked_prefill": cols["chunked_prefill"],
            "rate_per_s": cols["rate_per_s"]}


@dataclass
class UnitResult:
    records: list[RequestRecord]
    #: per-instance samples: (time_s, instance, running, waiting, kv_usage, preemptions[, prefix hit rate])
    timeline: Sequence[tuple] | pl.DataFrame = ()
    complete: bool = True
    #: more per-record columns, in ``records`` order (live load workers: ``load_worker``, ``clock_offset_s``)
    columns: dict[str, list] = field(default_factory=dict)


class Fleet(Protocol):
    """The instances of one variant, as a backend provides them."""

    num_instances: int

    def prepare(self, requests: list[Request]) -> None:
        """Called once per seed before its routers run (live: build text prompts)."""

    def run(self, unit: Unit, requests: list[Request], router: Any, reporter: Reporter) -> UnitResult: ...


class Backend(Protocol):
    def fleet(self, variant: Variant) -> ContextManager[Fleet]: ...


# ------------------------------------------------------------------------------------------------ simulator


@dataclass
class SimFleet:
    cfg: RunConfig
    profile: Profile
    variant: Variant
    run_id: str
    num_instances: int = 0

    def prepare(self, requests: list[Request]) -> None:
        pass

    def run(self, unit: Unit, requests: list[Request], router: Any, reporter: Reporter) -> UnitResult:
        from ..sim.cluster import ClusterSim

        sim = ClusterSim(self.profile, self.num_instances, requests,
                         instance_scheduler=self.variant.instance_scheduler,
                         chunked_prefill=self.variant.chunked_prefill, seed=unit.seed, run_id=self.run_id,
                         timeline_interval_s=self.cfg.timeline_interval_s, prefix_caching=self.cfg.prefix_caching)
        records = sim.run(router, label=unit.router,
                          progress=lambda done, total: reporter.unit_progress(unit.label, done, total))
        rows = [(s.time_s, s.instance, s.num_running, s.num_waiting, s.kv_usage, s.num_preemptions,
                 s.prefix_cache_hit_rate) for s in sim.timeline]
        return UnitResult(records, rows, True)


@dataclass
class SimBackend:
    cfg: RunConfig
    profile: Profile
    run_id: str

    @contextlib.contextmanager
    def fleet(self, variant: Variant) -> Iterator[SimFleet]:
        yield SimFleet(self.cfg, self.profile, variant, self.run_id, self.cfg.instances)


# ------------------------------------------------------------------------------------------------ live


def live_spec(profile: Profile, url: str) -> InstanceSpec:
    """What a router may assume of a live instance: the profile's spec (the one the simulator gives routers),
    with the KV capacity the engine itself reports (vLLM's ``cache_config_info``) where it does."""
    from dataclasses import replace

    from ..profiling.measure import MeasureError, engine_info
    spec = profile.instance_spec()
    try:
        info = engine_info(url)
    except MeasureError:
        return spec
    return replace(spec, kv_capacity_tokens=info.num_blocks * info.block_size)


def prompt_text_builder(cfg: RunConfig, endpoints: list[str], reporter: Reporter
                        ) -> Callable[[list[Request]], dict[int, str]]:
    """A function from a seed's requests to their text prompts ({} when token ids are sent)."""
    from ..harness.replay import served_models
    from ..harness.text_prompts import (TextPromptError, accepts_token_ids, endpoint_counter, local_counter,
                                        texts_for)

    if cfg.prompt_mode == "ids":
        return lambda reqs: {}
    model = cfg.model or served_models(endpoints[0])[0]
    if cfg.prompt_mode == "auto" and accepts_token_ids(endpoints[0], model):
        return lambda reqs: {}
    count = None
    tok = cfg.tokenizer
    if tok and tok.startswith(("http://", "https://")):  # a backend's /tokenize (behind a gateway that lacks it)
        count = endpoint_counter(tok, model)
    elif tok:
        count = local_counter(tok)
    else:
        probe = endpoint_counter(endpoints[0], model)
        try:
            probe("probe")
            count = probe
        except TextPromptError:  # no /tokenize there: approximate lengths, said once
            reporter.note("text prompts with approximate lengths (the endpoint has no /tokenize; give a "
                          "tokenizer for exact ones)", warning=True)
    reporter.note(f"sending text prompts ({'exact lengths' if count else 'approximate lengths'})")

    def texts(reqs: list[Request]) -> dict[int, str]:
        out, inexact = texts_for(reqs, count)
        if count is not None and inexact:
            reporter.note(f"{inexact} prompts could not be built to their exact length", warning=True)
        return out
    return texts


@dataclass
class LiveFleet:
    cfg: RunConfig
    profile: Profile
    variant: Variant
    run_dir: RunDir | None
    endpoints: list[str]
    reporter: Reporter
    specs: list[InstanceSpec] = field(default_factory=list)
    num_instances: int = 0
    #: load workers of each unit (clock offset, lag), for run.toml
    worker_rows: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.num_instances = len(self.endpoints)
        self.specs = [live_spec(self.profile, url) for url in self.endpoints]
        self._texts = prompt_text_builder(self.cfg, self.endpoints, self.reporter)
        self._prompt_texts: dict[int, str] = {}
        self._priority_of = None
        if self.variant.instance_scheduler == "priority":  # servers run --scheduling-policy priority
            from ..routers.priority import request_priority
            self._priority_of = lambda r: request_priority(r, self.profile)

    def prepare(self, requests: list[Request]) -> None:
        self._prompt_texts = self._texts(requests)

    def run(self, unit: Unit, requests: list[Request], router: Any, reporter: Reporter) -> UnitResult:
        from ..harness.replay import run_replay

        cfg = self.cfg
        res = run_replay(requests, router, self.endpoints, model=cfg.model, specs=self.specs,
                         run_id=self.run_dir.run_id if self.run_dir else "", seed=unit.seed,
                         out_dir=self.run_dir.partial_dir(unit.label) if self.run_dir else None,
                         request_timeout_s=cfg.request_timeout_s, api=cfg.api, min_step_s=self.profile.min_step_s,
                         priority_of=self._priority_of, prompt_texts=self._prompt_texts, engine=cfg.engine,
                         scrape_interval_s=cfg.timeline_interval_s, label=unit.router,
                         stream_workers=cfg.stream_workers, load_workers=cfg.load_workers or 0,
                         ray=self._ray_connected(), send_lead_s=cfg.send_lead_s, keep_token_times=False,
                         progress=lambda done, total: reporter.unit_progress(unit.label, done, total))
        if res.load_workers:
            self.worker_rows += [{"unit": unit.label, **row} for row in res.load_workers]
            reporter.note(f"{unit.label}: " + "; ".join(
                f"load worker {w['worker']} ({w['requests']} requests): clock offset {w['clock_offset_ms']:+.3f} ms "
                f"(+/- {w['clock_error_ms']:.3f}), dispatch lag p50 {_ms(w['lag_p50_ms'])} p99 {_ms(w['lag_p99_ms'])}"
                for w in res.load_workers))
        if res.interrupted and res.interrupted.startswith("load worker"):
            reporter.note(f"{unit.label}: stopped: {res.interrupted}; the {len(res.records)} finished requests "
                          "are kept", warning=True)
        if self._prompt_texts:
            from ..harness.text_prompts import prompt_length_mismatches
            bad = prompt_length_mismatches(res.records)
            if bad:
                reporter.note(f"{bad} of {len(res.records)} requests of {unit.label} reached the server with "
                              "another prompt length than asked (text prompts; give a tokenizer for exact "
                              "lengths)", warning=True)
        return UnitResult(res.records, res.metrics, res.complete, res.record_columns)

    def _ray_connected(self) -> bool:
        """Join the Ray cluster of ``ray_address`` when load workers are to run there."""
        if not (self.cfg.ray_address and self.cfg.load_workers):
            return False
        from ..distributed.ray_cluster import connect
        connect(self.cfg.ray_address)
        return True


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} ms"


@dataclass
class LiveBackend:
    cfg: RunConfig
    profile: Profile
    run_dir: RunDir | None
    reporter: Reporter
    launched: list[str] = field(default_factory=list)
    worker_rows: list[dict] = field(default_factory=list)
    #: the launched servers' cores and the client's (``Placement.as_dict``), for run.toml
    placement: dict | None = None

    @contextlib.contextmanager
    def fleet(self, variant: Variant) -> Iterator[LiveFleet]:
        cfg = self.cfg
        if cfg.endpoints:
            from ..harness.replay import check_endpoints
            yield LiveFleet(cfg, self.profile, variant, self.run_dir, check_endpoints(cfg.endpoints),
                            self.reporter, worker_rows=self.worker_rows)
            return
        from ..engines.vllm.launcher import launch
        tag = "default" if variant.chunked_prefill is None else ("on" if variant.chunked_prefill else "off")
        self.reporter.note(f"launching {cfg.instances} x {cfg.launch_model} (chunked prefill {tag}) ...")
        policy = "priority" if variant.instance_scheduler == "priority" else None
        log_dir = self.run_dir.path / "logs" / f"chunked-{tag}" if self.run_dir else None
        with launch(cfg.launch_model, cfg.instances, chunked_prefill=variant.chunked_prefill,
                    vllm_python=cfg.vllm_python, scheduling_policy=policy, log_dir=log_dir,
                    cpus_per_instance=cfg.cpus_per_instance, front_end=cfg.api_server_cores) as eps:
            self.launched += list(eps)
            self.placement = getattr(eps, "placement", None) and eps.placement.as_dict()
            if self.placement is not None and self.run_dir is not None:
                self.run_dir.note(placement=self.placement)
            yield LiveFleet(cfg, self.profile, variant, self.run_dir, list(eps), self.reporter,
                            worker_rows=self.worker_rows)


def backend_for(cfg: RunConfig, profile: Profile, run_id: str, run_dir: RunDir | None,
                reporter: Reporter) -> Backend:
    if cfg.live:
        return LiveBackend(cfg, profile, run_dir, reporter)
    return SimBackend(cfg, profile, run_id)


# ------------------------------------------------------------------------------------------------ the plan


def gate_note(name: str, router: Any) -> str:
    """What to tell a user whose learned router's checkpoint routes with its guidance heuristic
    (the network did not beat it on the validation gate's workloads), so that no one reads the
    heuristic's numbers as the network's."""
    v = router.policy.meta.get("validation") or {}
    mismatch = getattr(router, "scheduler_mismatch", None)
    if mismatch and router.policy.meta.get("gate") != "heuristic":
        seen = (f": its network was trained against {mismatch[0]} engines and the run's are {mismatch[1]} "
                "(train one with --instance-scheduler)")
    else:
        seen = (f": on its validation workloads the network gave {v['network_e2e_s']:.1f} s mean E2E, the "
                f"heuristic {v['heuristic_e2e_s']:.1f} s" if v else "")
    return (f"{name}: checkpoint {router.checkpoint} routes with its guidance heuristic (least mixing penalty)"
            f"{seen}; --router-opt {name}.gate=false routes with the network")


def make_router(cfg: RunConfig, profile: Profile, unit: Unit, num_instances: int, chunked_prefill: bool) -> Any:
    """The router of one unit, with its options (a learned router's checkpoint for the engine mode)."""
    from ..routers import get_router

    opts = dict(cfg.router_options.get(unit.router, {}))
    if unit.router in LEARNED_ROUTERS:
        if "checkpoint" not in opts:
            opts["chunked_prefill"] = chunked_prefill  # picks the engine mode's checkpoint
        opts.setdefault("instance_scheduler", unit.variant.instance_scheduler)  # the scheduler guard
    return get_router(unit.router, num_instances=num_instances, seed=unit.seed, profile=profile, **opts)


def iter_units(cfg: RunConfig, profile: Profile, backend: Backend, reporter: Reporter | None = None
               ) -> Iterator[tuple[Unit, pl.DataFrame, pl.DataFrame | None, bool]]:
    """Run the plan on ``backend``: yield (unit, request rows, timeline rows, complete) per unit, stopping
    after a unit that did not complete."""
    from ..predict import annotate, load_predictor

    reporter = reporter or Reporter()
    predictor = load_predictor(cfg.predictor, profile=profile, seed=cfg.seed)
    gated_noted: set[str] = set()
    for v in cfg.variants():
        cols = run_columns(cfg, profile, v)
        with backend.fleet(v) as fleet:
            for seed in cfg.seed_list():
                reqs = annotate(build_requests(cfg, profile, seed, v.order), predictor)
                fleet.prepare(reqs)
                for name in cfg.routers:
                    unit = Unit(v, seed, name, unit_label(cfg, v, seed, name))
                    router = make_router(cfg, profile, unit, fleet.num_instances, cols["chunked_prefill"])
                    if getattr(router, "heuristic_only", False) and router.checkpoint not in gated_noted:
                        gated_noted.add(router.checkpoint)
                        reporter.note(gate_note(name, router))
                    reporter.unit_started(unit.label, len(reqs))
                    res = fleet.run(unit, reqs, router, reporter)
                    reporter.unit_finished(unit.label)
                    frame = records_frame(res.records, cols)
                    if res.columns:
                        frame = frame.with_columns([pl.Series(k, v) for k, v in res.columns.items()])
                    yield (unit, frame,
                           timeline_frame(res.timeline, timeline_columns(unit, cols)), res.complete)
                    if not res.complete:
                        return


def iter_sim_runs(cfg: RunConfig, profile: Profile, run_id: str, reporter: Reporter | None = None
                  ) -> Iterator[tuple[pl.DataFrame, pl.DataFrame | None]]:
    """(request rows, timeline rows) of every simulated unit (bench scripts and sweeps)."""
    for _unit, df, tl, _complete in iter_units(cfg, profile, SimBackend(cfg, profile, run_id), reporter):
        yield df, tl


def sim_frames(args: tuple[RunConfig, str]) -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """Every simulated unit of one config (a sweep's worker; top level so that it pickles)."""
    from ..profiles import load_profile

    cfg, run_id = args
    frames, timelines = [], []
    for df, tl in iter_sim_runs(cfg, load_profile(cfg.profile), run_id):
        frames.append(df)
        if tl is not None:
            timelines.append(tl)
    return frames, timelines


@dataclass
class RunOutcome:
    summary: pl.DataFrame
    complete: bool
    path: Path
    run_id: str


def run_experiment(cfg: RunConfig, out_dir: Path | str, *, profile: Profile | None = None,
                   reporter: Reporter | None = None, run_id: str | None = None,
                   executor: Any = None) -> RunOutcome:
    """Run a whole experiment into ``out_dir`` and return its summary.

    ``cfg`` is resolved and checked first. Simulated units run on ``executor`` (an
    ``lbbench.distributed.Executor``, which the caller closes; default: a process pool of ``cfg.jobs``
    processes when that is over 1, else this process); the records do not depend on where they ran. A live
    run replays from this process whatever the executor. Ctrl-C, a live replay that did not complete, or a
    live instance that died between units end the run early: everything measured is kept and ``run.toml``
    says ``complete = false``. A unit whose worker died twice (``lbbench.distributed.UnitError``) does the
    same, then the error is raised.
    """
    from ..distributed import SerialExecutor, UnitError, get_executor
    from ..harness.replay import EndpointError
    from ..profiles import load_profile
    from .parallel import run_sim_units

    cfg = cfg.resolved()
    profile = profile or load_profile(cfg.profile)
    cfg.check(profile)
    reporter = reporter or Reporter()
    run_id = run_id or uuid.uuid4().hex[:12]
    rd = RunDir(out_dir, cfg, profile, run_id)
    rd.start()
    t0 = time.perf_counter()
    complete = True
    backend = backend_for(cfg, profile, run_id, rd, reporter)
    own_executor = executor is None and not cfg.live
    if own_executor:
        executor = get_executor(cfg.jobs if len(plan_all(cfg)) > 1 else 1)
    failure: UnitError | None = None
    try:
        if not cfg.live and not isinstance(executor, SerialExecutor):
            run_sim_units(cfg, profile, run_id, executor, rd, reporter)
        else:  # one unit after the other here, with per-request progress (a load sweep: rate by rate)
            for c in cfg.sweep():
                b = backend if c is cfg else SimBackend(c, profile, run_id)
                for _unit, df, tl, ok in iter_units(c, profile, b, reporter):
                    rd.add(df, tl)
                    complete = complete and ok
    except KeyboardInterrupt:
        complete = False
    except UnitError as exc:
        reporter.note(f"stopping: {exc}", warning=True)
        complete, failure = False, exc
    except EndpointError as exc:
        if not rd.frames:  # nothing measured yet: the endpoints were never usable
            raise
        reporter.note(f"stopping: {exc}", warning=True)  # an instance died between units
        complete = False
    finally:
        if own_executor:
            executor.close()
    extra: dict[str, Any] = {"wall_s": round(time.perf_counter() - t0, 3)}
    if isinstance(backend, LiveBackend) and backend.worker_rows:
        extra["load_workers"] = backend.worker_rows
    if not cfg.live and executor is not None:
        extra.update(executor.describe())
    if failure is not None:
        extra["error"] = str(failure)
    if isinstance(backend, LiveBackend) and backend.launched:
        extra["launched_endpoints"] = backend.launched
        if backend.placement is not None:
            extra["placement"] = backend.placement
    summary = rd.finish(complete, extra)
    if failure is not None:
        raise failure
    return RunOutcome(summary, complete, rd.path, run_id)
