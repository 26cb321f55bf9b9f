"""Resuming an interrupted run (``lbbench run --resume RUN_DIR``): keep its complete units, run the rest.

``load_resume(path, cfg, profile)`` reads the run directory ``lbbench.rundir`` wrote. It first compares the settings
that define the units and their records (``UNIT_SETTINGS``: the workload, requests, seeds, routers, rates, the
fleet, the predictor, ...) with those ``run.toml`` recorded, and refuses one that differs, naming it:
``--resume: run.toml has requests=200, this run asks 300``. Settings that change only how a run is carried out
(``jobs``, the endpoints' URLs, load or stream workers, timeouts, ``slo``) may differ. It then cuts the tables
into the units ``run.toml``'s ``[[units]]`` lists and keeps the complete ones; ``run_experiment`` runs the
others and writes every unit, kept or new, in unit order under the run's own id, so that a resumed simulated run
has the very records of an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from ..profiles import Profile
from ..rundir import RUN_TOML, clean, read_run_toml, read_unit_tables, scan_requests
from .config import ConfigError, RunConfig

#: ``RunConfig`` fields that define a run's units and their records; a resumed run must ask the same
UNIT_SETTINGS: tuple[str, ...] = (
    "backend", "profile", "fleet", "instances", "instance_schedulers", "chunked_prefill", "prefix_caching",
    "workload", "trace", "trace_options", "rates", "rate_per_s", "requests", "orders", "seeds", "seed",
    "burstiness", "prompt_tokens", "output_tokens", "routers", "router_options", "predictor",
    "timeline_interval_s", "decisions", "counterfactual", "counterfactual_every", "launch_model", "launch_args",
    "model", "api", "engine", "prompt_mode", "saturation_threshold_per_s", "saturation_window_s",
    "saturation_stop", "on_saturation",
)

#: one unit's frames: requests, timeline, decisions
Frames = tuple[pl.DataFrame, "pl.DataFrame | None", "pl.DataFrame | None"]


@dataclass
class Resumed:
    """What an interrupted run left: its id and its complete units' frames by unit label."""

    run_id: str
    units: dict[str, Frames] = field(default_factory=dict)
    dropped: int = 0  # units written but not complete (run again)


def _show(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ",".join(_show(x) for x in v) or "none"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_show(x)}" for k, x in v.items()) + "}"
    return str(v)


def settings_differ(recorded: dict[str, Any], cfg: RunConfig) -> tuple[str, Any, Any] | None:
    """The first unit-defining setting whose value ``run.toml``'s ``[config]`` and ``cfg`` disagree on, with
    both values (as ``run.toml`` writes them); None when they agree."""
    asked = clean(asdict(cfg))
    for name in UNIT_SETTINGS:
        if name == "trace_options" and not cfg.trace:
            continue  # they shape a trace only (the CLI fills their defaults either way)
        if recorded.get(name) != asked.get(name):
            return name, recorded.get(name), asked.get(name)
    return None


def _slice(frame: pl.DataFrame | None, start: int, n: int) -> pl.DataFrame | None:
    return None if frame is None or n == 0 else frame.slice(start, n)


def load_resume(path: Path | str, cfg: RunConfig, profile: Profile) -> Resumed:
    """The complete units of the run directory ``path``, after checking that ``cfg`` (resolved) asks for the
    same units; ``ConfigError`` (one line) otherwise."""
    path = Path(path)
    doc = read_run_toml(path)
    if not doc:
        raise ConfigError(f"--resume: {path} is not a run directory (no {RUN_TOML})")
    diff = settings_differ(doc.get("config", {}), cfg)
    if diff is not None:
        name, had, asks = diff
        raise ConfigError(f"--resume: {RUN_TOML} has {name}={_show(had)}, this run asks {_show(asks)}")
    fleet = clean(cfg.fleet_of(profile).to_toml_dict())
    if "fleet" in doc and doc["fleet"] != fleet:
        raise ConfigError(f"--resume: {RUN_TOML} has fleet={_show(doc['fleet'].get('spec'))}, this run asks "
                          f"{_show(fleet.get('spec'))}")
    out = Resumed(str(doc.get("run_id", "")))
    units = doc.get("units")
    if units is None:
        requests = scan_requests(path)
        if requests is not None and requests.collect_schema() and doc.get("runs_completed"):
            raise ConfigError(f"--resume: {RUN_TOML} lists no units (written before --resume existed); "
                              "start a new run")
        return out  # stopped before any unit was written: every unit runs
    tables = read_unit_tables(path)
    starts = [0, 0, 0]
    for u in units:
        counts = [int(u.get(k, 0)) for k in ("requests", "timeline", "decisions")]
        if u.get("complete", False) and tables[0] is not None:
            req, tl, dec = (_slice(t, s, n) for t, s, n in zip(tables, starts, counts))
            out.units[str(u["label"])] = (req if req is not None else tables[0].clear(), tl, dec)
        else:
            out.dropped += 1
        starts = [s + n for s, n in zip(starts, counts)]
    return out
