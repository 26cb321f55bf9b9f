"""One `lbbench run`: build the workload, run every router on it, write the run directory.

An experiment is a grid of *variants* (instance scheduler × chunked prefill ×
arrival order) × seeds × routers. Seeds are paired: for a given seed (and
order) every router sees exactly the same requests, arrivals and predictions.
The simulator backend runs here; live backends (``--endpoint``/``--launch``)
reuse the same workload, predictor and output code through ``lbbench.harness``.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import subprocess
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import polars as pl
import tomli_w

from . import __version__
from .core import RECORD_FIELDS, Request, RequestRecord
from .profiles import Profile

WORKLOADS = ("paper-mix", "paper-classes", "poisson")


class ConfigError(ValueError):
    """Bad user input: the message names the flag or file and what is wrong."""


@dataclass
class RunConfig:
    """Resolved configuration of one `lbbench run` (written to run.toml)."""

    profile: str = "llama2-7b-v100"
    instances: int = 4
    workload: str = "paper-mix"
    trace: str | None = None
    trace_options: dict[str, Any] = field(default_factory=dict)
    rate_per_s: float | None = 20.0
    requests: int | None = 2000
    routers: list[str] = field(default_factory=lambda: ["round_robin"])
    router_options: dict[str, Any] = field(default_factory=dict)
    instance_schedulers: list[str] = field(default_factory=lambda: ["fcfs"])
    chunked_prefill: list[bool | None] = field(default_factory=lambda: [None])
    orders: list[str | None] = field(default_factory=lambda: [None])
    seeds: int = 1
    seed: int = 0
    burstiness: float = 1.0
    predictor: str = "oracle"
    prompt_tokens: str = "128"
    output_tokens: str = "128"
    timeline_interval_s: float | None = 1.0
    backend: str = "sim"
    rates: list[float] = field(default_factory=list)
    """A load sweep: one run per rate (``rate_per_s`` is then None), ``rate_per_s`` a group key."""
    slo: dict[str, float] = field(default_factory=dict)
    """Latency limits for goodput: any of ``ttft_s``, ``tbt_s``, ``e2e_s`` (seconds)."""
    jobs: int = 1
    """Processes a load sweep runs its rates in (results do not depend on it)."""
    prefix_caching: bool | None = None
    """Automatic prefix caching in the simulated instances (None: as the profile says)."""

    def seed_list(self) -> list[int]:
        return list(range(self.seed, self.seed + self.seeds))


@dataclass(frozen=True)
class Variant:
    instance_scheduler: str
    chunked_prefill: bool | None
    order: str | None


def variants(cfg: RunConfig) -> list[Variant]:
    return [Variant(s, c, o) for o in cfg.orders for s in cfg.instance_schedulers
            for c in cfg.chunked_prefill]


# ---------------------------------------------------------------------------- workloads


def build_requests(cfg: RunConfig, profile: Profile, seed: int, order: str | None) -> list[Request]:
    """The requests for one seed (and arrival order), before predictions."""
    from . import workloads as wl

    n = cfg.requests
    if cfg.trace:
        from .workloads.session_traces import is_session_trace, load_session_trace
        from .workloads.traces import load_trace_requests
        opts = dict(cfg.trace_options)
        if is_session_trace(cfg.trace):  # conversations (chat_id / parent_chat_id): replayed closed loop
            return load_session_trace(cfg.trace, rate=cfg.rate_per_s, requests=n, **opts)
        return load_trace_requests(cfg.trace, rate=cfg.rate_per_s, requests=n, **opts)
    rate = cfg.rate_per_s if cfg.rate_per_s is not None else 20.0
    n = n if n is not None else 2000
    w = cfg.workload
    if w == "paper-mix":
        return wl.paper_mix(n, rate, seed, burstiness=cfg.burstiness)
    if w == "paper-classes":
        return wl.paper_classes(order or "all_random", n, rate, seed, profile, burstiness=cfg.burstiness)
    if w == "poisson":
        return wl.poisson(n, rate, seed, prompt_tokens=wl.parse_length_spec(cfg.prompt_tokens, "--prompt-tokens"),
                          output_tokens=wl.parse_length_spec(cfg.output_tokens, "--output-tokens"),
                          burstiness=cfg.burstiness)
    if w.split(":", 1)[0] in ("sessions", "shared-prefix"):
        from .workloads.sessions import parse_session_spec, sessions
        return sessions(n, rate, seed, parse_session_spec(w), max_model_len=profile.max_model_len,
                        burstiness=cfg.burstiness)
    if w.startswith("dataset:"):
        from .predict.dataset_workload import dataset_workload
        return dataset_workload(w.split(":", 1)[1], n, rate, seed, max_model_len=profile.max_model_len)
    raise ConfigError(f"--workload: unknown workload {w!r} (choose from {', '.join(WORKLOADS)}, "
                      "sessions[:K=V,...], shared-prefix[:K=V,...], dataset:FILE, or give --trace FILE)")


def workload_label(cfg: RunConfig) -> str:
    return f"trace:{Path(cfg.trace).name}" if cfg.trace else cfg.workload


# ---------------------------------------------------------------------------- running


@dataclass
class RunResult:
    requests: pl.DataFrame
    timeline: pl.DataFrame | None
    complete: bool = True


ProgressFn = Callable[[str, int, int], None]


def records_frame(records: Sequence[RequestRecord], extra: dict[str, Any]) -> pl.DataFrame:
    schema = {
        "run_id": pl.Utf8, "router": pl.Utf8, "seed": pl.Int64, "request_id": pl.Int64, "task": pl.Utf8,
        "instance": pl.Int64, "arrival_s": pl.Float64, "dispatch_s": pl.Float64,
        "first_token_s": pl.Float64, "finish_s": pl.Float64, "prompt_tokens": pl.Int64,
        "output_tokens": pl.Int64, "generated_tokens": pl.Int64, "predicted_output_tokens": pl.Int64,
        "predicted_bucket": pl.Int64, "num_preemptions": pl.Int64, "tbt_mean_s": pl.Float64,
        "tbt_p99_s": pl.Float64, "tbt_max_s": pl.Float64, "planned_send_s": pl.Float64,
        "actual_send_s": pl.Float64, "server_prompt_tokens": pl.Int64, "server_output_tokens": pl.Int64,
        "http_status": pl.Int64, "error": pl.Utf8, "session_id": pl.Int64, "turn": pl.Int64,
        "think_s": pl.Float64, "cached_prompt_tokens": pl.Int64,
    }
    cols = {name: [getattr(r, name) for r in records] for name in RECORD_FIELDS}
    df = pl.DataFrame(cols, schema=schema)
    return df.with_columns([pl.lit(v).alias(k) for k, v in extra.items()])


def run_columns(cfg: RunConfig, profile: Profile, v: Variant) -> dict[str, Any]:
    chunked = profile.chunked_prefill if v.chunked_prefill is None else v.chunked_prefill
    return {
        "profile": profile.name, "workload": workload_label(cfg), "num_instances": cfg.instances,
        "instance_scheduler": v.instance_scheduler, "chunked_prefill": bool(chunked),
        "order": v.order, "rate_per_s": cfg.rate_per_s, "backend": cfg.backend,
    }


def iter_sim_runs(cfg: RunConfig, profile: Profile, run_id: str,
                  progress: ProgressFn | None = None) -> Iterator[tuple[pl.DataFrame, pl.DataFrame | None]]:
    """Yield (requests frame, timeline frame) for every variant × seed × router."""
    from .predict import annotate, load_predictor
    from .routers import get_router
    from .sim.cluster import ClusterSim

    predictor = load_predictor(cfg.predictor, profile=profile, seed=cfg.seed)
    for v in variants(cfg):
        for seed in cfg.seed_list():
            reqs = annotate(build_requests(cfg, profile, seed, v.order), predictor)
            for name in cfg.routers:
                router = get_router(name, num_instances=cfg.instances, seed=seed, profile=profile,
                                    **cfg.router_options.get(name, {}))
                sim = ClusterSim(profile, cfg.instances, reqs, instance_scheduler=v.instance_scheduler,
                                 chunked_prefill=v.chunked_prefill, seed=seed, run_id=run_id,
                                 timeline_interval_s=cfg.timeline_interval_s, prefix_caching=cfg.prefix_caching)
                label = f"{name} seed {seed}" + (f" {v.order}" if v.order else "") + (
                    f" {v.instance_scheduler}" if len(cfg.instance_schedulers) > 1 else "")
                cb = (lambda done, total, _l=label: progress(_l, done, total)) if progress else None
                records = sim.run(router, progress=cb)
                extra = run_columns(cfg, profile, v)
                tl = None
                if sim.timeline:
                    tl = pl.DataFrame({
                        "time_s": [s.time_s for s in sim.timeline],
                        "instance": [s.instance for s in sim.timeline],
                        "num_running": [s.num_running for s in sim.timeline],
                        "num_waiting": [s.num_waiting for s in sim.timeline],
                        "kv_usage": [s.kv_usage for s in sim.timeline],
                        "num_preemptions": [s.num_preemptions for s in sim.timeline],
                        "prefix_cache_hit_rate": pl.Series([s.prefix_cache_hit_rate for s in sim.timeline],
                                                           dtype=pl.Float64),
                    }).with_columns(pl.lit(name).alias("router"), pl.lit(seed).alias("seed"),
                                    pl.lit(v.order).alias("order"),
                                    pl.lit(v.instance_scheduler).alias("instance_scheduler"),
                                    pl.lit(extra["chunked_prefill"]).alias("chunked_prefill"),
                                    pl.lit(cfg.rate_per_s, pl.Float64).alias("rate_per_s"))
                yield records_frame(records, extra), tl


def sweep_configs(cfg: RunConfig) -> list[RunConfig]:
    """One config per rate of a load sweep (the config itself when it is not one)."""
    if not cfg.rates:
        return [cfg]
    return [replace(cfg, rate_per_s=rate, rates=[]) for rate in cfg.rates]


def _sim_frames(args: tuple[RunConfig, str]) -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """Every run of one config (a sweep's worker; top level so that it pickles)."""
    from .profiles import load_profile

    cfg, run_id = args
    frames, timelines = [], []
    for df, tl in iter_sim_runs(cfg, load_profile(cfg.profile), run_id):
        frames.append(df)
        if tl is not None:
            timelines.append(tl)
    return frames, timelines


def iter_sweep(cfg: RunConfig, run_id: str) -> Iterator[tuple[list[pl.DataFrame], list[pl.DataFrame]]]:
    """Yield (requests frames, timeline frames) per rate of a load sweep, in rate order.

    With ``cfg.jobs > 1`` the rates run in that many processes (spawned, not forked:
    a forked child can deadlock on locks held by polars' threads); every run is
    deterministic for its seed, so the records are the same as one rate at a time.
    """
    work = [(c, run_id) for c in sweep_configs(cfg)]
    jobs = min(cfg.jobs, len(work))
    if jobs <= 1:
        for w in work:
            yield _sim_frames(w)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
        yield from ex.map(_sim_frames, work)


# ---------------------------------------------------------------------------- output


def git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    out = {"lbbench": __version__, "python": platform.python_version()}
    for dist in ("polars", "numpy", "click", "rich", "aiohttp"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def default_out_dir(cfg: RunConfig) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{workload_label(cfg).replace(':', '-').replace('/', '-')}"


def write_run_toml(path: Path, cfg: RunConfig, profile: Profile, run_id: str, complete: bool,
                   extra: dict[str, Any] | None = None) -> None:
    def clean(x: Any) -> Any:
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items() if v is not None}
        if isinstance(x, (list, tuple)):
            return [clean(v) if v is not None else "default" for v in x]
        return x
    doc = {
        "run_id": run_id,
        "complete": complete,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision() or "unknown",
        "config": clean(asdict(cfg)),
        "seeds": cfg.seed_list(),
        "profile": clean({k: v for k, v in asdict(profile).items() if k != "source"}),
        "profile_source": profile.source,
        "versions": versions(),
    }
    if extra:
        doc.update(clean(extra))
    path.write_text(tomli_w.dumps(doc))


def slo_of(cfg: RunConfig) -> Any:
    """The run's ``Slo`` (None without ``--slo``)."""
    from .reports.summary import Slo

    return Slo(**cfg.slo) if cfg.slo else None


def write_outputs(out_dir: Path, frames: list[pl.DataFrame], timelines: list[pl.DataFrame],
                  by: Sequence[str], slo: Any = None) -> pl.DataFrame:
    """Write requests/timeline/summary parquet; the summary carries the reference columns
    (gain against the strongest baseline, ``lbbench.reports.reference``)."""
    from .reports.reference import with_reference
    from .reports.summary import summarize

    out_dir.mkdir(parents=True, exist_ok=True)
    df = pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
    df.write_parquet(out_dir / "requests.parquet")
    if timelines:
        pl.concat(timelines, how="diagonal_relaxed").write_parquet(out_dir / "timeline.parquet")
    summary = with_reference(summarize(df, by=by, slo=slo), df, by, slo) if df.height else pl.DataFrame()
    summary.write_parquet(out_dir / "summary.parquet")
    return summary


def group_keys(cfg: RunConfig) -> list[str]:
    keys = ["router"]
    if len(cfg.rates) > 1:
        keys.append("rate_per_s")
    if cfg.orders != [None]:
        keys.append("order")
    if len(cfg.instance_schedulers) > 1:
        keys.append("instance_scheduler")
    if len(cfg.chunked_prefill) > 1:
        keys.append("chunked_prefill")
    return keys


def to_json(summary: pl.DataFrame) -> str:
    rows = summary.to_dicts()
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float) and v != v:
                row[k] = None
    return json.dumps(rows, indent=2)
