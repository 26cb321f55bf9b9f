"""Where a run's units run: the simulator (``SimBackend``) or live servers (``LiveBackend``).

A backend runs one ``Work`` with ``run(work)``: it gives the one unit body (``units.run_unit``) its ``Instances``
and its reporter. It also says where its units run (``executor(given)``), what ``run.toml`` records about it
(``describe``), which errors end a run early keeping what was measured (``stopping_errors``), and releases what
it holds (``close``); ``run_experiment`` asks nothing else of it.

- ``SimBackend``: ``ClusterSim`` in virtual time. Its units may run anywhere — here, a process pool or Ray
  tasks (an ``lbbench.distributed`` executor) — with the same records: a copy pickled to a worker runs its
  units alone and reports to nobody (per-request progress reaches the reporter only in this process).
- ``LiveBackend``: the same ``Dispatcher`` over HTTP (``lbbench.harness.replay``) on attached endpoints or
  launched vLLM servers, one fleet per variant, opened when the variant's first unit comes and kept until the
  next variant (or ``close``). Its units run here, one after the other (``SerialExecutor``): a fleet of
  servers and their connections do not travel to a worker.

Both give routers each instance's ``InstanceSpec`` from its fleet profile (live: with the KV capacity the engine
reports, unless the endpoint was attached as ``URL@PROFILE``, whose profile is taken as it stands) and build
records with ``RequestRecord.for_request`` under the unit's router label.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Iterator, Protocol

from ..admission import parse_admission
from ..core import InstanceSpec, Request
from ..distributed import Executor, SerialExecutor, get_executor
from ..distributed.ray_cluster import connect
from ..engines.vllm.info import EngineInfoError, engine_info
from ..engines.vllm.launcher import launch
from ..live.saturation import SaturationPolicy, default_threshold, records_saturated_at
from ..harness.text_prompts import (TextPromptError, accepts_token_ids, endpoint_counter, local_counter,
                                    prompt_length_mismatches, texts_for)
from ..profiles import Profile
from ..rundir import RunDir
from ..priority import request_priority
from ..kv_links import kv_bytes_per_token, parse_kv_link
from ..sim.cluster import ClusterSim
from ..sim.disagg import DisaggSim
from .config import RunConfig, Variant, split_endpoint
from .units import Reporter, UnitOutput, UnitResult, Work, plan_all, run_unit


class Backend(Protocol):
    def run(self, work: Work) -> UnitOutput: ...
    def executor(self, given: Executor | None) -> Executor: ...
    def describe(self, executor: Executor) -> dict[str, Any]: ...
    @property
    def stopping_errors(self) -> tuple[type[BaseException], ...]: ...
    def close(self) -> None: ...


def backend_for(cfg: RunConfig, profile: Profile, run_dir: RunDir | None, reporter: Reporter) -> Backend:
    """The backend of a (resolved) config: live when it names endpoints or a model to launch."""
    if cfg.live:
        return LiveBackend(cfg, profile, run_dir, reporter)
    return SimBackend(reporter, jobs=cfg.jobs if len(plan_all(cfg)) > 1 else 1)


# ------------------------------------------------------------------------------------------------ simulator


@dataclass
class SimFleet:
    profiles: list[Profile]  # one per instance
    roles: list[str] | None = None  # prefill/decode roles, one per instance (None: none, ``ClusterSim``)

    @property
    def num_instances(self) -> int:
        return len(self.profiles)

    def prepare(self, requests: list[Request]) -> None:
        pass

    def run(self, work: Work, requests: list[Request], router: Any, reporter: Reporter) -> UnitResult:
        cfg, unit = work.cfg, work.unit
        kw: dict[str, Any] = {}
        if self.roles is not None:  # a prefill/decode fleet (lbbench.sim.disagg)
            kw = {"roles": self.roles, "kv_link": parse_kv_link(cfg.kv_link),
                  "kv_bytes_per_token": [kv_bytes_per_token(p) for p in self.profiles]}
        sim = (DisaggSim if kw else ClusterSim)(
            None, self.num_instances, requests, profiles=self.profiles,
            instance_scheduler=unit.variant.instance_scheduler, chunked_prefill=unit.variant.chunked_prefill,
            seed=unit.seed, run_id=work.run_id, timeline_interval_s=cfg.timeline_interval_s,
            prefix_caching=cfg.prefix_caching, admission=parse_admission(cfg.admission) if cfg.admission else None,
            signal_lag_s=cfg.signal_lag_s, **kw)
        records = sim.run(router, label=unit.router,
                          progress=lambda done, total: reporter.unit_progress(work.label, done, total))
        rows = [(s.time_s, s.instance, s.num_running, s.num_waiting, s.kv_usage, s.num_preemptions,
                 s.prefix_cache_hit_rate) for s in sim.timeline]
        pol = saturation_policy(cfg, requests)  # marked as a live run would be, without stopping
        return UnitResult(records, rows, True,
                          saturated_at_s=records_saturated_at(records, pol.threshold_per_s, pol.window_s))


def saturation_policy(cfg: RunConfig, requests: list[Request]) -> SaturationPolicy:
    """The unit's saturation policy: the config's threshold, or ``default_threshold`` of its requests (a quarter of
    their mean arrival rate)."""
    threshold = cfg.saturation_threshold_per_s or default_threshold([r.arrival_s for r in requests])
    return SaturationPolicy(threshold, cfg.saturation_window_s, cfg.saturation_stop, cfg.on_saturation)


@dataclass
class SimBackend:
    reporter: Reporter = field(default_factory=Reporter)
    #: processes a run's units take when no executor is given (1: here, one after the other)
    jobs: int = 1
    #: no error ends a simulated run early but Ctrl-C (and an executor's ``UnitError``)
    stopping_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    def run(self, work: Work) -> UnitOutput:
        """Run one simulated unit (``backend.run`` is what an executor sends to its workers)."""
        roles = work.fleet.roles() if work.fleet is not None and work.fleet.is_disaggregated else None
        return run_unit(work, SimFleet(work.instance_profiles(), roles), self.reporter)

    def executor(self, given: Executor | None) -> Executor:
        return given if given is not None else get_executor(self.jobs)

    def describe(self, executor: Executor) -> dict[str, Any]:
        return executor.describe()

    def close(self) -> None:
        pass

    def __getstate__(self) -> dict:
        return {"jobs": self.jobs}  # a copy in a worker reports to nobody

    def __setstate__(self, state: dict) -> None:
        self.reporter, self.jobs = Reporter(), state["jobs"]


# ------------------------------------------------------------------------------------------------ live


def live_specs(cfg: RunConfig, profile: Profile, urls: list[str]) -> list[InstanceSpec]:
    """What routers may assume of each live instance: an attached ``URL@PROFILE``'s is that profile's spec as it
    stands (the user vouches for it); any other's is its fleet profile's with the KV capacity its engine reports
    (``live_spec``)."""
    fleet = cfg.fleet_of(profile)
    pinned = [split_endpoint(e)[1] is not None for e in cfg.endpoints] or [False] * len(urls)
    specs = [p.instance_spec() if pin else live_spec(p, url) for p, pin, url in zip(fleet.profiles(), pinned, urls)]
    return [replace(s, role=role) for s, role in zip(specs, fleet.roles())]  # URL@PROFILE:ROLE


def live_spec(profile: Profile, url: str) -> InstanceSpec:
    """What a router may assume of a live instance: the profile's spec (the one the simulator gives routers),
    with the KV capacity the engine itself reports (vLLM's ``cache_config_info``) where it does."""
    spec = profile.instance_spec()
    try:
        info = engine_info(url)
    except EngineInfoError:
        return spec
    return replace(spec, kv_capacity_tokens=info.num_blocks * info.block_size)


def prompt_text_builder(cfg: RunConfig, endpoints: list[str], reporter: Reporter
                        ) -> Callable[[list[Request]], dict[int, str]]:
    """A function from a seed's requests to their text prompts ({} when token ids are sent)."""
    from ..harness.replay import served_models  # lazy: the replay client (aiohttp) would slow every sim start

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
        if not self.specs:
            self.specs = [live_spec(self.profile, url) for url in self.endpoints]
        self._texts = prompt_text_builder(self.cfg, self.endpoints, self.reporter)
        self._prepared: list[Request] | None = None
        self._prompt_texts: dict[int, str] = {}
        self._priority_of = None
        if self.variant.instance_scheduler == "priority":  # servers run --scheduling-policy priority
            profiles = self.cfg.fleet_of(self.profile).profiles()  # each instance's own, as in the simulator
            self._priority_of = lambda r, i: request_priority(r, profiles[i])

    def prepare(self, requests: list[Request]) -> None:
        if requests is not self._prepared:  # a new seed (one seed's units share the list)
            self._prompt_texts = self._texts(requests)
            self._prepared = requests

    def run(self, work: Work, requests: list[Request], router: Any, reporter: Reporter) -> UnitResult:
        # lazy: the replay client (aiohttp) would slow every sim start
        from ..harness.replay import ReplaySettings, run_replay

        cfg, unit = self.cfg, work.unit
        settings = ReplaySettings(
            run_id=self.run_dir.run_id if self.run_dir else "", seed=unit.seed, model=cfg.model, specs=self.specs,
            out_dir=self.run_dir.partial_dir(work.label) if self.run_dir else None,
            request_timeout_s=cfg.request_timeout_s, api=cfg.api, min_step_s=self.profile.min_step_s,
            priority_of=self._priority_of, prompt_texts=self._prompt_texts, engine=cfg.engine,
            scrape_interval_s=cfg.timeline_interval_s, label=unit.router, stream_workers=cfg.stream_workers,
            load_workers=cfg.load_workers or 0, ray=self._ray_connected(), send_lead_s=cfg.send_lead_s,
            keep_token_times=False, saturation=saturation_policy(cfg, requests),
            kv_events=cfg.kv_events or None,
            admission=parse_admission(cfg.admission) if cfg.admission else None, signal_lag_s=cfg.signal_lag_s,
            progress=lambda done, total: reporter.unit_progress(work.label, done, total))
        res = run_replay(requests, router, self.endpoints, settings)
        if res.load_workers:
            self.worker_rows += [{"unit": unit.label, **row} for row in res.load_workers]
            reporter.note(f"{unit.label}: " + "; ".join(
                f"load worker {w['worker']} ({w['requests']} requests): clock offset {w['clock_offset_ms']:+.3f} ms "
                f"(+/- {w['clock_error_ms']:.3f}), dispatch lag p50 {_ms(w['lag_p50_ms'])} p99 {_ms(w['lag_p99_ms'])}"
                for w in res.load_workers))
        if res.kv_events is not None:
            kv = res.kv_events
            reporter.note(f"{unit.label}: KV events: {kv['batches']} batches, {kv['blocks_stored']} blocks stored, "
                          f"{kv['blocks_removed']} removed, {kv['batches_missed']} batches missed on the wire, "
                          f"{kv['blocks_unchained']} blocks skipped (parent unknown), {kv['bad_messages']} unreadable",
                          warning=kv["batches"] == 0 or kv["batches_missed"] > 0 or kv["bad_messages"] > 0)
        if res.interrupted and res.interrupted.startswith("load worker"):
            reporter.note(f"{unit.label}: stopped: {res.interrupted}; the {res.num_records} finished requests "
                          "are kept", warning=True)
        records = res.frame()  # streamed to the unit's partial folder: read lazily, never held here
        if self.run_dir is None:  # a temporary folder, gone with ``res``: read now
            records = records.collect().lazy()
        if self._prompt_texts:
            bad = prompt_length_mismatches(records)
            if bad:
                reporter.note(f"{bad} of {res.num_records} requests of {unit.label} reached the server with "
                              "another prompt length than asked (text prompts; give a tokenizer for exact "
                              "lengths)", warning=True)
        return UnitResult(records, res.metrics, res.complete,
                          saturated_at_s=res.saturated_at_s, saturation_stopped=cfg.saturation_stop)

    def _ray_connected(self) -> bool:
        """Join the Ray cluster of ``ray_address`` when load workers are to run there."""
        if not (self.cfg.ray_address and self.cfg.load_workers):
            return False
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
    #: each launched server: its endpoint, the variant's chunked prefill and its own engine arguments (run.toml)
    launched_instances: list[dict] = field(default_factory=list)
    worker_rows: list[dict] = field(default_factory=list)
    #: the launched servers' cores and the client's (``Placement.as_dict``), for run.toml
    placement: dict | None = None
    _variant: Variant | None = field(default=None, init=False, repr=False)
    _fleet: LiveFleet | None = field(default=None, init=False, repr=False)
    _open: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, init=False, repr=False)

    def run(self, work: Work) -> UnitOutput:
        """Run one unit on its variant's fleet (the previous variant's is closed first)."""
        if self._fleet is None or work.unit.variant != self._variant:
            self.close()
            self._fleet = self._open.enter_context(self.fleet(work.unit.variant))
            self._variant = work.unit.variant
        return run_unit(work, self._fleet, self.reporter)

    def executor(self, given: Executor | None) -> Executor:
        return SerialExecutor()  # replays run from this process whatever executor a caller gives

    def describe(self, executor: Executor) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.worker_rows:
            out["load_workers"] = self.worker_rows
        if self.launched:
            out["launched_endpoints"] = self.launched
            out["launched_instances"] = self.launched_instances
            if self.placement is not None:
                out["placement"] = self.placement
        return out

    @property
    def stopping_errors(self) -> tuple[type[BaseException], ...]:
        """An instance that died between units."""
        from ..harness.replay import EndpointError  # lazy: the replay client (aiohttp) would slow every sim start
        return (EndpointError,)

    def close(self) -> None:
        """Close the open fleet (stops the servers it launched)."""
        self._fleet, self._variant = None, None
        self._open.close()

    @contextlib.contextmanager
    def fleet(self, variant: Variant) -> Iterator[LiveFleet]:
        from ..harness.replay import check_endpoints  # lazy: the replay client (aiohttp) would slow every sim start

        cfg = self.cfg
        if cfg.endpoints:
            urls = check_endpoints(cfg.endpoint_urls())
            yield LiveFleet(cfg, self.profile, variant, self.run_dir, urls, self.reporter,
                            specs=live_specs(cfg, self.profile, urls), worker_rows=self.worker_rows)
            return
        tag = "default" if variant.chunked_prefill is None else ("on" if variant.chunked_prefill else "off")
        self.reporter.note(f"launching {cfg.instances} x {cfg.launch_model} (chunked prefill {tag}) ...")
        policy = "priority" if variant.instance_scheduler == "priority" else None
        log_dir = self.run_dir.path / "logs" / f"chunked-{tag}" if self.run_dir else None
        with launch(cfg.launch_model, cfg.instances, chunked_prefill=variant.chunked_prefill,
                    vllm_python=cfg.vllm_python, scheduling_policy=policy, log_dir=log_dir,
                    cpus_per_instance=cfg.cpus_per_instance, front_end=cfg.api_server_cores,
                    instance_args=cfg.launch_args) as eps:
            self.launched += list(eps)
            self.launched_instances += [{"endpoint": url, "chunked_prefill": tag,
                                         "engine_args": list(cfg.launch_args.get(i, []))}
                                        for i, url in enumerate(eps)]
            self.placement = getattr(eps, "placement", None) and eps.placement.as_dict()
            if self.placement is not None and self.run_dir is not None:
                self.run_dir.note(placement=self.placement)
            yield LiveFleet(cfg, self.profile, variant, self.run_dir, list(eps), self.reporter,
                            specs=live_specs(cfg, self.profile, list(eps)), worker_rows=self.worker_rows)
