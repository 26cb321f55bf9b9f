"""The typed configuration of one ``lbbench run``: every simulated and live field, its default and its checks.

``RunConfig`` is what a run directory's ``run.toml`` records under ``[config]``. A caller (the CLI, a bench
script, a test) fills the fields it knows; ``resolved()`` fills the defaults that depend on other fields
(requests and rate per workload, the paper-classes orders, the instance count of an attached fleet, the
shipped checkpoint of a learned router) and ``check(profile)`` rejects what cannot run — before any long work
starts. Errors are ``ConfigError``s naming the field (``rate_per_s``), not a flag: the CLI maps fields to flags.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..admission import AdmissionError, parse_admission, parse_tenants
from ..engines import ENGINES
from ..errors import InputError
from ..fleet import Fleet, FleetEntry, FleetError, parse_fleet, split_role
from ..live.kv_events import address_problem
from ..live.saturation import DEFAULT_WINDOW_S
from ..predict import load_predictor
from ..profiles import ProfileError, available_profiles, load_profile
from ..routers import get_router
from ..kv_links import DEFAULT_LINK, KVLinkError, kv_bytes_per_token, parse_kv_link
from ..routers import available_routers
from ..routers.registry import (KV_EVENTS_REFUSAL, ORACLE_REFUSAL, UnknownRouterError, is_pair_router,
                                needs_kv_events, needs_simulator)
from ..sim.instance import INSTANCE_SCHEDULERS
from ..workloads import PAPER_CLASS_ORDERS

if TYPE_CHECKING:
    from ..profiles import Profile

WORKLOADS = ("paper-mix", "paper-classes", "poisson")
LEARNED_ROUTERS = ("baseline_rl", "wa_rl", "wgrl")
APIS = ("completions", "chat")
PROMPT_MODES = ("auto", "ids", "text")


class ConfigError(InputError):
    """A ``RunConfig`` that cannot run; ``field`` names the offending field."""


#: below this rate (requests/s) one process sends, reads and decides with lags under a few ms
LOAD_WORKER_MIN_RATE_PER_S = 40.0
#: the rate one load worker is given at most (one process kept about 1,000 req/s against a zero-latency server)
LOAD_WORKER_RATE_PER_S = 1000.0


def auto_load_workers(rate_per_s: float | None, cpus: int) -> int:
    """Load workers for a live run: none below ``LOAD_WORKER_MIN_RATE_PER_S`` or on one core (a worker would
    share the core with the driver), else one per ``LOAD_WORKER_RATE_PER_S``, leaving the driver a core."""
    if rate_per_s is None or rate_per_s < LOAD_WORKER_MIN_RATE_PER_S or cpus < 2:
        return 0
    return max(1, min(cpus - 1, math.ceil(rate_per_s / LOAD_WORKER_RATE_PER_S)))


@dataclass
class RunConfig:
    """Resolved configuration of one `lbbench run` (written to run.toml)."""

    # -- the cluster ------------------------------------------------------------------------------------
    profile: str = "llama2-7b-v100"
    """Profile name or TOML path: the simulated instance, and what routers may assume of a live one."""
    instances: int = 4
    """Simulated or launched instances (an attached fleet has one per endpoint)."""
    fleet: str | None = None
    """A mixed fleet, ``NAME_OR_PATH:COUNT[,NAME_OR_PATH:COUNT...]`` (``lbbench.fleet.parse_fleet``): instance
    ``i`` runs the profile of the entry it falls in. None: ``instances`` x ``profile``, the uniform fleet.
    ``resolved()`` sets ``profile`` to the first entry's (what legacy routers are given) and ``instances`` to
    the fleet's size."""
    instance_schedulers: list[str] = field(default_factory=lambda: ["fcfs"])
    """Instance-level schedulers, each a variant (live: one, the servers' own)."""
    chunked_prefill: list[bool | None] = field(default_factory=lambda: [None])
    """Chunked prefill per variant (None: as the profile says; live attach: as the servers run)."""
    prefix_caching: bool | None = None
    """Automatic prefix caching in the simulated instances (None: as the profile says)."""
    kv_link: str = DEFAULT_LINK
    """Prefill/decode fleets (roles in ``fleet``): the link a request's KV crosses from its prefill to its decode
    instance, ``NAME`` (``lbbench.kv_links.LINKS``), ``NAME@LATENCY_S`` or ``BYTES_S[@LATENCY_S]``."""
    # -- the workload -----------------------------------------------------------------------------------
    workload: str = "paper-mix"
    trace: str | None = None
    trace_options: dict[str, Any] = field(default_factory=dict)
    rate_per_s: float | None = 20.0
    requests: int | None = 2000
    rates: list[float] = field(default_factory=list)
    """A load sweep: one run per rate (``rate_per_s`` is then None), ``rate_per_s`` a group key. Live, each rate is
    a step on the same fleet, one after the other; a saturated step is marked and the sweep goes on."""
    orders: list[str | None] = field(default_factory=lambda: [None])
    """paper-classes arrival orders, each a variant ([None]: all four for paper-classes)."""
    seeds: int = 1
    seed: int = 0
    burstiness: float = 1.0
    prompt_tokens: str = "128"
    output_tokens: str = "128"
    # -- the routers --------------------------------------------------------------------------------------
    routers: list[str] = field(default_factory=lambda: ["round_robin"])
    router_options: dict[str, Any] = field(default_factory=dict)
    predictor: str = "oracle"
    # -- flow control -----------------------------------------------------------------------------------
    admission: str | None = None
    """Flow control at the gateway, ``max_queue=N[,max_outstanding=N][,fairness=round_robin|fcfs]``
    (``lbbench.admission``): requests held while the pool is full, shed (429/503) over ``max_queue``; None: off."""
    tenants: str | None = None
    """Tenants drawn for the requests, ``NAME[:PRIORITY][@SHARE],...`` (``lbbench.admission.parse_tenants``):
    flow control's fairness ids and priority bands; None: one anonymous tenant in band 0."""
    signal_lag_s: float = 0.0
    """The router sees what the instances report (load, first tokens, finishes) this many seconds late
    (``lbbench.dispatch.Dispatcher``); 0: at once."""
    # -- output -------------------------------------------------------------------------------------------
    timeline_interval_s: float | None = 1.0
    slo: dict[str, float] = field(default_factory=dict)
    """Latency limits for goodput: any of ``ttft_s``, ``tbt_s``, ``e2e_s`` (seconds)."""
    jobs: int = 1
    """Processes a simulated load sweep runs its rates in (results do not depend on it)."""
    decisions: bool = False
    """Write ``decisions.parquet``: every routing decision, its features, choice and scores
    (``lbbench.experiment.decisions``)."""
    counterfactual: int | None = None
    """Simulator only: at each decision also roll the chosen action and the K best alternatives forward on forks
    (the planner's horizon and costs) and record each decision's regret (None: off; implies ``decisions``)."""
    counterfactual_every: int = 1
    """With ``counterfactual``: run it at every N-th decision only (bounds the run time)."""
    # -- live backends ----------------------------------------------------------------------------------
    endpoints: list[str] = field(default_factory=list)
    """Attach to these running OpenAI-compatible servers (one instance each)."""
    kv_events: list[str] = field(default_factory=list)
    """Attached endpoints: each one's KV-event publisher (a ZMQ address, ``tcp://HOST:PORT``, in ``endpoints``'
    order), for routers that read KV events (``precise_prefix``; ``lbbench.live.kv_events``)."""
    launch_model: str | None = None
    """Launch ``instances`` local vLLM servers of this model first (``tiny``: the small local test model)."""
    launch_args: dict[int, list[str]] = field(default_factory=dict)
    """Launched servers: more vLLM arguments for some instances, by index (one fleet, different engine settings,
    e.g. ``{1: ["--no-enable-chunked-prefill"]}``)."""
    model: str | None = None
    """Model name requested from live endpoints (None: the first one served)."""
    api: str = "completions"
    engine: str = "vllm"
    """The endpoints' engine: its request fields and metric names (``lbbench.engines``)."""
    prompt_mode: str = "auto"
    """Token ids, text built to the exact length, or ``auto``: ids unless the endpoint refuses them."""
    tokenizer: str | None = None
    """Text prompts: a local tokenizer path or a backend URL whose ``/tokenize`` makes lengths exact."""
    vllm_python: str | None = None
    """Python of the vLLM environment for launched servers."""
    cpus_per_instance: int | None = None
    """Launched CPU servers: pin each to its own N cores and the client to the rest (None: cores shared)."""
    api_server_cores: str = "client"
    """With ``cpus_per_instance``: where each server's API server runs, ``client`` (the client's cores) or
    ``instance`` (beside its engine core)."""
    request_timeout_s: float = 600.0
    stream_workers: int = 0
    """Live: worker processes that send and read the streams (0: all in the dispatcher's process)."""
    load_workers: int | None = None
    """Live: load workers that send at the planned times and read the streams, the router deciding in this
    process (``lbbench.live.load_workers``); None: chosen from the rate and the cores (``auto_load_workers``)."""
    send_lead_s: float = 0.02
    """Live, load workers: how long before an arrival the router decides it and hands it to its worker."""
    ray_address: str | None = None
    """Live, load workers: run them as Ray actors on this cluster (``auto`` or an address)."""
    saturation_threshold_per_s: float | None = None
    """Saturation: the backlog growth (requests/s, least-squares over ``saturation_window_s``) that marks a step
    saturated (``lbbench.live.saturation``); None: a quarter of the step's mean arrival rate."""
    saturation_window_s: float = DEFAULT_WINDOW_S
    """Saturation: the window the backlog must grow over, throughout, in seconds."""
    saturation_stop: bool = True
    """Live: stop sending when a step saturates (False: only mark it, as the simulator does)."""
    on_saturation: str = "drain"
    """Live, on saturation: ``drain`` the requests in flight, or ``cancel`` them (recorded as failed)."""
    backend: str = "sim"
    """``sim`` or ``live`` (set by ``resolved()`` from the endpoints / launch fields)."""

    def seed_list(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))

    @property
    def live(self) -> bool:
        return bool(self.endpoints or self.launch_model)

    def endpoint_urls(self) -> list[str]:
        """The attached endpoints' URLs, without their ``@PROFILE`` (``split_endpoint``)."""
        return [split_endpoint(e)[0] for e in self.endpoints]

    def fleet_of(self, profile: Profile | None = None) -> Fleet:
        """The fleet this config runs: ``fleet`` parsed; else, attached endpoints each with its ``@PROFILE`` (or
        ``profile``); else ``instances`` x ``profile`` (``profile``: the loaded ``self.profile``, or a profile a
        caller built in memory). Raises ``ConfigError`` naming ``fleet`` or ``endpoints``."""
        if self.fleet is not None:
            try:
                return parse_fleet(self.fleet)
            except FleetError as exc:
                raise ConfigError(str(exc).removeprefix("fleet: "), "fleet") from None
        base = profile if profile is not None else load_profile(self.profile)
        if not any(split_endpoint(e)[1] for e in self.endpoints):
            return Fleet.uniform(base, self.instances)
        entries: list[FleetEntry] = []
        for text in self.endpoints:
            url, ref = split_endpoint(text)
            prof, role = base, "mixed"
            if ref:
                ref, role = split_role(ref)  # URL@PROFILE:ROLE: a prefill/decode role, as --fleet's
                try:
                    prof = load_profile(ref)
                except ProfileError as exc:
                    known = ", ".join(available_profiles())
                    detail = (f"unknown profile {ref!r} (known: {known}; or a path to a .toml file)"
                              if not Path(ref).is_file() else " ".join(str(exc).split()))
                    raise ConfigError(f"{text}: {detail}", "endpoints") from None
            if entries and entries[-1].profile == prof and entries[-1].role == role:
                entries[-1] = FleetEntry(prof, entries[-1].count + 1, role)
            else:
                entries.append(FleetEntry(prof, 1, role))
        try:
            return Fleet(tuple(entries))
        except FleetError as exc:
            raise ConfigError(str(exc).removeprefix("fleet: "), "endpoints") from None

    # -------------------------------------------------------------------------------------- defaults
    def resolved(self) -> RunConfig:
        """This config with the defaults that depend on other fields filled in (idempotent)."""
        cfg = replace(self, routers=list(self.routers), orders=list(self.orders), rates=list(self.rates),
                      router_options={k: dict(v) for k, v in self.router_options.items()})
        if cfg.requests is None and not cfg.trace:
            cfg.requests = 3000 if cfg.workload == "paper-classes" else 2000
        if len(cfg.rates) == 1:
            cfg.rate_per_s, cfg.rates = cfg.rates[0], []
        elif cfg.rates:
            cfg.rate_per_s = None
        if cfg.workload == "paper-classes" and not cfg.trace and cfg.orders == [None]:
            cfg.orders = list(PAPER_CLASS_ORDERS)
        fleet = cfg.fleet_of() if cfg.fleet is not None else None
        if fleet is not None:
            cfg.profile = profile_ref(fleet.entries[0].profile)
            cfg.instances = fleet.num_instances
        if cfg.endpoints:
            cfg.instances = len(cfg.endpoints)
        cfg.backend = "live" if cfg.live else "sim"
        if cfg.load_workers is None:
            top = cfg.rate_per_s or max(cfg.rates, default=None)  # a live sweep: its highest step's
            cfg.load_workers = (auto_load_workers(top, os.cpu_count() or 1)
                                if cfg.live and not cfg.stream_workers and not any(map(is_pair_router, cfg.routers))
                                else 0)
        for name in cfg.routers:  # a pair router that predicts transfers reads the run's link
            if name == "pd_joint":
                cfg.router_options.setdefault(name, {}).setdefault("kv_link", cfg.kv_link)
        label = workload_label(cfg)
        for name in cfg.routers:  # a learned router picks the shipped checkpoint trained on this workload, if any
            if name in LEARNED_ROUTERS and "checkpoint" not in cfg.router_options.get(name, {}):
                cfg.router_options.setdefault(name, {}).setdefault("workload", label)
                if fleet is not None and not fleet.is_uniform:  # the checkpoint trained on this fleet, if any
                    cfg.router_options[name].setdefault("fleet", fleet.spec())
        return cfg

    # ---------------------------------------------------------------------------------------- checks
    def check(self, profile: Profile) -> None:
        """Raise ``ConfigError`` for anything that cannot run; builds the predictor and every router once."""
        if not self.routers:
            raise ConfigError("give at least one router name", "routers")
        if self.instances < 1:
            raise ConfigError(f"{self.instances}: need at least one instance", "instances")
        if self.fleet is not None and self.endpoints:
            raise ConfigError("attached endpoints carry their profiles as URL@PROFILE, not a fleet spec", "fleet")
        fleet = self.fleet_of(profile)
        if fleet.num_instances != self.instances:
            raise ConfigError(f"{fleet.spec()} has {fleet.num_instances} instances, the config "
                              f"{self.instances}", "fleet")
        for s in self.instance_schedulers:
            if s not in INSTANCE_SCHEDULERS:
                raise ConfigError(f"unknown {s!r} (choose from {', '.join(INSTANCE_SCHEDULERS)})",
                                  "instance_schedulers")
        if self.orders != [None]:
            if self.workload != "paper-classes" or self.trace:
                raise ConfigError("only applies to the paper-classes workload", "orders")
            for o in self.orders:
                if o not in PAPER_CLASS_ORDERS:
                    raise ConfigError(f"unknown order {o!r} (choose from {', '.join(PAPER_CLASS_ORDERS)})",
                                      "orders")
        if self.trace and not Path(self.trace).is_file():
            raise ConfigError(f"{self.trace}: no such file", "trace")
        for r in [self.rate_per_s, *self.rates]:
            if r is not None and not r > 0:
                raise ConfigError(f"{r:g} must be > 0 requests/s", "rate_per_s")
        for name in self.router_options:
            if name not in self.routers:
                raise ConfigError(f"router {name!r} has options but is not among the routers", "router_options")
        self._check_live()
        self._check_decisions()
        self._check_admission()
        self._check_roles(fleet)
        load_predictor(self.predictor, profile=profile, seed=self.seed)
        for r in self.routers:
            try:
                get_router(r, num_instances=self.instances, seed=self.seed, profile=profile,
                           **self.router_options.get(r, {}))
            except UnknownRouterError:
                raise
            except (TypeError, ValueError) as exc:
                if not self.router_options.get(r) or isinstance(exc, InputError):
                    raise
                raise ConfigError(f"router {r!r}: {exc}", "router_options") from None

    def _check_admission(self) -> None:
        try:
            if self.admission is not None:
                parse_admission(self.admission)
            if self.tenants is not None:
                parse_tenants(self.tenants)
        except AdmissionError as exc:
            raise ConfigError(exc.problem, exc.field) from None
        if not self.signal_lag_s >= 0:
            raise ConfigError(f"{self.signal_lag_s:g} must be >= 0 seconds", "signal_lag_s")

    def _check_roles(self, fleet: Fleet) -> None:
        """A fleet with roles runs pair routers on the simulator, and pair routers need one."""
        try:
            parse_kv_link(self.kv_link)
        except KVLinkError as exc:
            raise ConfigError(str(exc).removeprefix("kv_link: "), "kv_link") from None
        pair = [r for r in self.routers if is_pair_router(r)]
        if not fleet.is_disaggregated:
            if pair:
                raise ConfigError(f"{pair[0]} routes prefill/decode pairs: give a fleet with roles "
                                  "(--fleet NAME:COUNT:prefill,NAME:COUNT:decode)", "routers")
            return
        if self.live and not self.endpoints:
            raise ConfigError("a fleet with prefill/decode roles runs on the simulator or on attached endpoints "
                              "that speak llm-d's P/D protocol (lbbench serve-sim --fleet NAME:N:prefill,"
                              "NAME:N:decode), not on launched servers", "fleet")
        if self.live and (self.stream_workers or self.load_workers):
            raise ConfigError("a live prefill/decode run streams from the dispatcher's process (the pair routers "
                              "move each request between two instances there); give 0",
                              "stream_workers" if self.stream_workers else "load_workers")
        other = [r for r in self.routers if r not in pair]
        if other:
            raise ConfigError(f"{other[0]} routes whole requests; a fleet with prefill/decode roles needs a pair "
                              f"router ({', '.join(n for n in available_routers() if is_pair_router(n))})",
                              "routers")
        if self.counterfactual is not None:
            raise ConfigError("its alternatives are single instances, not prefill/decode pairs; not on a fleet with "
                              "roles", "counterfactual")
        if self.admission is not None:
            raise ConfigError("flow control is not combined with prefill/decode roles yet (it holds whole requests, "
                              "the pair routers place two legs)", "admission")
        for e in fleet.entries:
            try:
                kv_bytes_per_token(e.profile)
            except KVLinkError as exc:
                raise ConfigError(str(exc).removeprefix("kv_link: "), "fleet") from None

    def _check_decisions(self) -> None:
        if self.counterfactual is not None:
            if self.counterfactual < 1:
                raise ConfigError(f"{self.counterfactual}: must be >= 1 alternatives", "counterfactual")
            if self.live:
                raise ConfigError("needs simulator forks; a live run (--endpoint, --launch) has none (--decisions "
                                  "records its decisions without counterfactuals)", "counterfactual")
        if self.counterfactual_every < 1:
            raise ConfigError(f"{self.counterfactual_every}: must be >= 1", "counterfactual_every")

    def _check_live(self) -> None:
        if self.endpoints and self.launch_model:
            raise ConfigError("launch new servers or attach to running ones, not both", "launch_model")
        if self.stream_workers < 0:
            raise ConfigError(f"{self.stream_workers}: must be >= 0", "stream_workers")
        if self.load_workers is not None and self.load_workers < 0:
            raise ConfigError(f"{self.load_workers}: must be >= 0", "load_workers")
        if self.load_workers and self.stream_workers:
            raise ConfigError("choose load workers or stream workers, not both", "load_workers")
        if not 0 <= self.send_lead_s <= 1:
            raise ConfigError(f"{self.send_lead_s}: must be between 0 and 1 second", "send_lead_s")
        if self.launch_args and not self.launch_model:
            raise ConfigError("only for launched servers (--launch)", "launch_args")
        for i in self.launch_args:
            if not 0 <= i < self.instances:
                raise ConfigError(f"no instance {i} among {self.instances} (0 to {self.instances - 1})",
                                  "launch_args")
        if self.cpus_per_instance is not None and not self.launch_model:
            raise ConfigError("only for launched servers (--launch)", "cpus_per_instance")
        if self.api_server_cores not in ("client", "instance"):
            raise ConfigError(f"{self.api_server_cores!r}: must be client or instance", "api_server_cores")
        if self.saturation_threshold_per_s is not None and not self.saturation_threshold_per_s > 0:
            raise ConfigError(f"{self.saturation_threshold_per_s:g} must be > 0 requests/s",
                              "saturation_threshold_per_s")
        if not self.saturation_window_s > 0:
            raise ConfigError(f"{self.saturation_window_s:g} must be > 0 seconds", "saturation_window_s")
        if self.on_saturation not in ("drain", "cancel"):
            raise ConfigError(f"{self.on_saturation!r}: must be drain or cancel", "on_saturation")
        if self.api not in APIS:
            raise ConfigError(f"unknown API {self.api!r} (choose from {', '.join(APIS)})", "api")
        if self.prompt_mode not in PROMPT_MODES:
            raise ConfigError(f"unknown prompt mode {self.prompt_mode!r} (choose from {', '.join(PROMPT_MODES)})",
                              "prompt_mode")
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r} (known: {', '.join(ENGINES)})", "engine")
        if self.engine != "vllm" and not self.endpoints:
            raise ConfigError(f"{self.engine}: only for attached endpoints (launched servers are vLLM; the "
                              "simulator has no engine dialect)", "engine")
        problem = address_problem(self.kv_events, len(self.endpoints))
        if problem:
            raise ConfigError(problem, "kv_events")
        if not self.live:
            return
        for r in self.routers:
            if needs_simulator(r):
                raise ConfigError(ORACLE_REFUSAL.format(name=r), "routers")
            if needs_kv_events(r) and not self.kv_events:
                raise ConfigError(KV_EVENTS_REFUSAL.format(name=r), "routers")
        if len(self.instance_schedulers) > 1:
            raise ConfigError("a live fleet runs one instance scheduler, its servers' own; give one",
                              "instance_schedulers")
        if self.endpoints and self.chunked_prefill != [None]:
            raise ConfigError("attached servers run chunked prefill as they were started; it cannot be set",
                              "chunked_prefill")

    # ------------------------------------------------------------------------------------------ plan
    def variants(self) -> list[Variant]:
        """The grid of variants (arrival order × instance scheduler × chunked prefill), in run order."""
        return [Variant(s, c, o) for o in self.orders for s in self.instance_schedulers
                for c in self.chunked_prefill]

    def group_keys(self) -> list[str]:
        """The summary's group columns: the router plus every setting this config varies."""
        keys = ["router"]
        if len(self.rates) > 1:
            keys.append("rate_per_s")
        if self.orders != [None]:
            keys.append("order")
        if len(self.instance_schedulers) > 1:
            keys.append("instance_scheduler")
        if len(self.chunked_prefill) > 1:
            keys.append("chunked_prefill")
        return keys

    def sweep(self) -> list[RunConfig]:
        """One config per rate of a load sweep (the config itself when it is not one)."""
        if not self.rates:
            return [self]
        return [replace(self, rate_per_s=rate, rates=[]) for rate in self.rates]


@dataclass(frozen=True)
class Variant:
    instance_scheduler: str
    chunked_prefill: bool | None
    order: str | None


def profile_ref(profile: Profile) -> str:
    """How a spec names ``profile``: its shipped name when that name loads it, else its file's path."""
    return Fleet((FleetEntry(profile, 1),)).spec().rpartition(":")[0]


def split_endpoint(text: str) -> tuple[str, str | None]:
    """``URL@PROFILE`` -> ``(URL, PROFILE)``; a bare ``URL`` -> ``(URL, None)``. The profile is what follows
    the last ``@`` when a URL (``scheme://host...``) comes before it."""
    url, sep, ref = text.rpartition("@")
    if sep and "://" in url and url.split("://", 1)[1] and ref.strip():
        return url, ref.strip()
    return text, None


def workload_label(cfg: RunConfig) -> str:
    return f"trace:{Path(cfg.trace).name}" if cfg.trace else cfg.workload
