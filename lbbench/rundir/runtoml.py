"""A run directory's ``run.toml``: what the run was asked (the resolved config), on what, with which versions.

``write_run_toml`` writes the document of a run of a ``RunConfig`` (any dataclass with ``seed_list()``: this
floor does not import ``lbbench.experiment``); ``write_run_doc`` writes any document (synthetic runs);
``read_run_toml`` reads one back. TOML has no null: ``clean`` drops None values of tables and writes None list
items as ``"default"``, the form ``lbbench run --resume`` compares a config in.
"""

from __future__ import annotations

import datetime as _dt
import platform
import subprocess
import tomllib
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Protocol

import tomli_w

from .. import __version__
from ..fleet import Fleet
from ..profiles import Profile
from .layout import RUN_TOML


class RunSettings(Protocol):
    """What ``run.toml`` reads of a run's config (``lbbench.experiment.RunConfig``, a dataclass)."""

    slo: dict[str, float] | None

    def seed_list(self) -> list[int]: ...

    def group_keys(self) -> list[str]: ...


def git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str]:
    out = {"lbbench": __version__, "python": platform.python_version()}
    for dist in ("polars", "numpy", "click", "rich", "aiohttp"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def clean(x: Any) -> Any:
    """TOML has no null: drop None values of tables, write None list items as "default"."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items() if v is not None}
    if isinstance(x, (list, tuple)):
        return [clean(v) if v is not None else "default" for v in x]
    return x


def config_record(cfg: RunSettings) -> dict[str, Any]:
    """``run.toml``'s ``[config]``: every field of ``cfg`` (a None left out, a None list item written "default"),
    the form ``lbbench run --from`` and ``--resume`` compare a config in."""
    return clean(asdict(cfg))  # type: ignore[call-overload]  # a dataclass


def profile_record(profile: Profile) -> dict[str, Any]:
    """``run.toml``'s ``[profile]``: every field of ``profile`` but its source (``profile_source``)."""
    return clean({k: v for k, v in asdict(profile).items() if k != "source"})


def now_utc() -> str:
    """The time ``run.toml`` records (``created``: when the run started), UTC, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_run_toml(run_dir: Path, cfg: RunSettings, profile: Profile, run_id: str, complete: bool,
                   extra: dict[str, Any] | None = None, fleet: Fleet | None = None,
                   created: str | None = None) -> None:
    """``run_dir/run.toml`` of a run of ``cfg`` on ``profile`` (and ``fleet``), with ``extra`` keys; ``created``
    is when the run started (now when not given)."""
    doc = {
        "run_id": run_id,
        "complete": complete,
        "created": created or now_utc(),
        "git_revision": git_revision() or "unknown",
        "config": config_record(cfg),
        "seeds": cfg.seed_list(),
        "profile": profile_record(profile),
        "profile_source": profile.source,
        "versions": versions(),
    }
    if fleet is not None:
        doc["fleet"] = clean(fleet.to_toml_dict())
    if extra:
        doc.update(clean(extra))
    write_run_doc(run_dir, doc)


def write_run_doc(run_dir: Path, doc: dict[str, Any]) -> None:
    """``run_dir/run.toml`` holding ``doc`` (None values dropped)."""
    (Path(run_dir) / RUN_TOML).write_text(tomli_w.dumps(clean(doc)))


def read_run_toml(run_dir: Path) -> dict[str, Any]:
    """A run directory's ``run.toml`` ({} when it has none); ``tomllib.TOMLDecodeError`` when unreadable."""
    p = Path(run_dir) / RUN_TOML
    if not p.is_file():
        return {}
    return tomllib.loads(p.read_text())
