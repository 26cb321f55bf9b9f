"""Scenario files and re-runs: ``lbbench run --config bench.toml`` and ``lbbench run --from RUN_DIR``.

Both become defaults of the command's own options (click's ``default_map``), so that a flag typed on the command
line overrides them and every value still goes through the flag's own parsing and checks:

- ``--config FILE``: a TOML file whose top-level keys are the command's long options without the dashes
  (``router``, ``instance_scheduler`` or ``instance-scheduler``, ``rate``, ...). The keys are read from the
  command's click options, so a new flag is a key at once. A value is the flag's value as TOML: a string, number
  or boolean (for an on/off flag); an array for a repeatable flag or for a flag's comma form (``router = ["jsq",
  "round_robin"]``, ``rate = [10, 20]``); a table for a ``KEY=VALUE`` flag (``slo = {ttft = 2, tbt = 0.1}``,
  ``router_opt = {late_binding_srpt = {max_wait_s = 600}}``); ``seeds = [0, 1, 2]`` for consecutive seeds. An
  unknown key, a value of the wrong type or a value the flag refuses is one line naming the file and the key.
- ``--from RUN_DIR``: the flags that give the ``[config]`` its ``run.toml`` recorded (the resolved ``RunConfig``:
  every flag's value, the seeds, the rates, the routers' options). Before anything runs, the flags are turned back
  into a config and compared with the recorded one field by field, so that a setting the flags cannot express is
  refused by name instead of run differently. A profile whose numbers changed since is named in a warning.

``--from`` and ``--config`` may be given together: the file's keys override the run's, the command line both.
"""

from __future__ import annotations

import difflib
import math
import shlex
import tomllib
from pathlib import Path
from typing import Any, Callable

import click

from ..errors import InputError
from ..workloads.trace_formats import MAPPING_KEYS
from ..rundir import RUN_TOML, config_record, profile_record, read_run_toml
from .common import err_console
from .flags import user_message

#: the scenario options' own parameter names (not keys of a scenario file)
_OWN = ("scenario_file", "from_run")
_META = "lbbench.scenario"


class ScenarioError(InputError):
    """A scenario file or a recorded run that cannot be used; the message names the file and the key."""


# --------------------------------------------------------------------------------------- --config FILE
def option_keys(command: click.Command) -> dict[str, click.Option]:
    """The scenario file's keys: each long option of ``command`` without its dashes, ``-`` written ``_``."""
    keys: dict[str, click.Option] = {}
    for p in command.params:
        if isinstance(p, click.Option) and p.name not in _OWN:
            long = max((o for o in p.opts if o.startswith("--")), key=len)
            keys[long[2:].replace("-", "_")] = p
    return keys


def _toml_type(v: Any) -> str:
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
                       (list, "an array"), (dict, "a table")):
        if isinstance(v, kind):
            return name
    return f"a {type(v).__name__}"


def _pairs(table: dict[str, Any], sep: str, prefix: str = "") -> list[str]:
    """A table as ``KEY=VALUE`` items, nested tables' keys joined with ``.`` (``ROUTER.KEY=VALUE``)."""
    out = []
    for k, v in table.items():
        if isinstance(v, dict):
            out += _pairs(v, sep, f"{prefix}{k}.")
        elif isinstance(v, (list, dict)):
            raise TypeError
        else:
            out.append(f"{prefix}{k}{sep}{_scalar(v)}")
    return out


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, str)):
        return str(v)
    raise TypeError


def _expects(p: click.Option, tables: bool) -> str:
    if p.is_flag:
        return "true or false"
    if isinstance(p.type, click.Choice):
        return "one of " + ", ".join(map(str, p.type.choices))
    if isinstance(p.type, click.types.IntParamType):
        return "an integer"
    if isinstance(p.type, click.types.FloatParamType):
        return "a number"
    what = "a string or an array of strings" if p.multiple else "a string (or an array: the flag's comma form)"
    return what + (" or a table of KEY = VALUE" if tables else "")


def _flag_value(p: click.Option, v: Any) -> Any:
    """A TOML value as the flag's value (what the command line would give); TypeError when it cannot be one."""
    tables = "=" in (p.metavar or "")
    if p.is_flag:
        if not isinstance(v, bool):
            raise TypeError
        return v
    if isinstance(v, bool) and isinstance(p.flag_value, str):
        return p.flag_value if v else None  # an option whose value may be left out (--ray, --resume)
    if isinstance(v, dict):
        if not tables:
            raise TypeError
        items = _pairs(v, "=")
        return items if p.multiple else ",".join(items)
    if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (
                isinstance(p.type, click.types.IntParamType) and not isinstance(v, int)):
            raise TypeError
        return v
    if isinstance(p.type, click.Choice):
        if not isinstance(v, str):
            raise TypeError
        return v
    if isinstance(v, list):
        items = [_scalar(x) for x in v]
        return items if p.multiple else ",".join(items)
    return [_scalar(v)] if p.multiple else _scalar(v)


def read_scenario(path: str | Path, ctx: click.Context) -> dict[str, Any]:
    """The values a scenario file gives the options of ``ctx.command``, by parameter name (``ScenarioError``
    naming the file and the key for anything the command would refuse)."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ScenarioError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"--config {path}: cannot read it ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None
    keys = option_keys(ctx.command)
    values: dict[str, Any] = {}
    for raw, v in doc.items():
        key = raw.replace("-", "_")
        if key == "seeds" and isinstance(v, list):  # consecutive seeds: the first, and how many
            if not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v) or \
                    v != list(range(v[0], v[0] + len(v))):
                raise ScenarioError(f"{path}: seeds: an array of seeds must be consecutive integers, like "
                                    f"[0, 1, 2] (or give seed = FIRST and seeds = COUNT), got {v!r}")
            if "seed" in doc:
                raise ScenarioError(f"{path}: seeds: an array of seeds names the first one; leave out seed")
            v, values["seed"] = len(v), keys["seed"].process_value(ctx, v[0])
        if key not in keys:
            close = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (keys: the options of lbbench {ctx.info_name})"
            raise ScenarioError(f"{path}: unknown key {raw!r}{hint}")
        p = keys[key]
        try:
            value = _flag_value(p, v)
        except TypeError:
            raise ScenarioError(f"{path}: {raw}: expected {_expects(p, '=' in (p.metavar or ''))}, got "
                                f"{_toml_type(v)} ({v!r})") from None
        try:
            p.process_value(ctx, value)  # the flag's own checks (ranges, choices, its parser), named by the key
        except click.BadParameter as exc:
            raise ScenarioError(f"{path}: {raw}: {exc.message}") from None
        values[p.name] = value
    return values


# ---------------------------------------------------------------------------------------- --from RUN_DIR
def _number(v: Any) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def _mapping(m: dict[str, Any]) -> str:
    """A recorded ``TraceMapping`` as ``--mapping`` writes it (the keys it takes; the others come from none)."""
    return ",".join(f"{k}={m[k]}" for k in MAPPING_KEYS if k in m)


def _window(w: list[float]) -> str:
    start, end = w
    return f"{_number(start)}:{'' if math.isinf(end) else _number(end)}"


#: per ``run.toml`` trace option: its option name and how its recorded value is written as the flag's
_TRACE_FLAGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "fmt": ("trace_format", str), "mapping": ("mapping", _mapping), "skip_bad_rows": ("skip_bad_rows", bool),
    "time_scale": ("time_scale", float), "window": ("window", _window),
    "max_prompt_tokens": ("max_prompt_tokens", int), "prompt_overflow": ("prompt_overflow", str),
}
_CHUNKED = {("default",): "profile", (True,): "on", (False,): "off", (False, True): "both"}
#: RunConfig fields whose flag (by parameter name) takes the recorded value as it is
_SAME = {
    "workload": "workload", "trace": "trace", "requests": "requests", "jobs": "jobs", "ray_address": "ray_address",
    "seeds": "seeds", "seed": "seed", "burstiness": "burstiness", "prompt_tokens": "prompt_tokens",
    "output_tokens": "output_tokens", "predictor": "predictor", "launch_model": "launch_model", "model": "model",
    "api": "api", "engine": "engine", "prompt_mode": "prompt_mode", "tokenizer": "tokenizer",
    "vllm_python": "vllm_python", "request_timeout_s": "request_timeout", "stream_workers": "stream_workers",
    "send_lead_s": "send_lead", "cpus_per_instance": "cpus_per_instance", "api_server_cores": "api_server_cores",
    "saturation_threshold_per_s": "saturation_threshold", "saturation_window_s": "saturation_window",
    "on_saturation": "on_saturation", "decisions": "decisions", "counterfactual": "counterfactual",
    "counterfactual_every": "counterfactual_every", "admission": "admission", "tenants": "tenants",
    "signal_lag_s": "signal_lag_s", "kv_link": "kv_link", "kv_events": "kv_events",
}
#: RunConfig fields set from others (``resolved()``), or read with another field
_DERIVED = {"backend", "rates", "rate_per_s", "profile", "instances", "fleet"}


def flags_of_config(config: dict[str, Any]) -> dict[str, Any]:
    """The option values (by parameter name) that give the ``[config]`` table a ``run.toml`` recorded."""
    c = config
    out: dict[str, Any] = {k: c[f] for f, k in _SAME.items() if f in c}
    if "fleet" in c:
        out["fleet"] = c["fleet"]
    else:
        out["profile"], out["instances"] = c.get("profile"), c.get("instances")
    rates = c.get("rates") or ([c["rate_per_s"]] if "rate_per_s" in c else [])
    if rates:
        out["rate"] = ",".join(_number(r) for r in rates)
    for name, value in c.get("trace_options", {}).items():
        if name not in _TRACE_FLAGS:
            raise ScenarioError(f"trace option {name}: this version of lbbench run has no flag for it")
        flag, as_flag = _TRACE_FLAGS[name]
        out[flag] = as_flag(value)
    if c.get("slo"):
        out["slo"] = ",".join(f"{k.removesuffix('_s')}={_number(v)}" for k, v in c["slo"].items())
    out["routers"] = ",".join(c.get("routers", []))
    out["instance_scheduler"] = ",".join(c.get("instance_schedulers", []))
    out["chunked_prefill"] = _CHUNKED.get(tuple(c.get("chunked_prefill", ["default"])))  # None: the check names it
    out["prefix_caching"] = {True: "on", False: "off"}.get(c.get("prefix_caching"), "profile")
    if c.get("orders", ["default"]) != ["default"]:
        out["order"] = ",".join(c["orders"])
    out["router_opts"] = [f"{r}.{k}={_scalar(v)}" for r, opts in c.get("router_options", {}).items()
                          for k, v in opts.items() if not isinstance(v, (list, dict))]
    out["timeline_interval"] = c.get("timeline_interval_s", 0)
    out["endpoints"] = list(c.get("endpoints", []))
    out["launch_args"] = [f"{i}:{shlex.join(words)}" for i, words in c.get("launch_args", {}).items()]
    if "load_workers" in c:
        out["load_workers"] = str(c["load_workers"])
    out["no_saturation_stop"] = not c.get("saturation_stop", True)
    unknown = sorted(set(c) - set(_SAME) - _DERIVED - {
        "trace_options", "slo", "routers", "instance_schedulers", "chunked_prefill", "prefix_caching", "orders",
        "router_options", "timeline_interval_s", "endpoints", "launch_args", "load_workers", "saturation_stop"})
    if unknown:
        raise ScenarioError(f"{unknown[0]}: this version of lbbench run has no flag for it")
    return {k: v for k, v in out.items() if v is not None}


def _show(v: Any) -> str:
    return "none" if v is None else repr(v)


def repeat_flags(run_dir: str | Path, ctx: click.Context, build: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """The option values that repeat the run in ``run_dir`` (by parameter name), after checking that they give
    the very config its ``run.toml`` recorded; ``build`` turns every option's value into a ``RunConfig``."""
    path = Path(run_dir)
    where = f"--from {path}"
    if not (path / RUN_TOML).is_file():
        raise ScenarioError(f"{where}: not a run directory (no {RUN_TOML})")
    try:
        doc = read_run_toml(path)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{where}: {RUN_TOML} is not valid TOML: {exc}") from None
    recorded = doc.get("config")
    if not isinstance(recorded, dict):
        raise ScenarioError(f"{where}: {RUN_TOML} has no [config] table")
    try:
        flags = flags_of_config(recorded)
    except ScenarioError as exc:
        raise ScenarioError(f"{where}: {RUN_TOML} records {exc}") from None
    kw = {p.name: p.process_value(ctx, flags.get(p.name, p.default)) for p in ctx.command.params
          if p.name not in _OWN}
    cfg = build(kw).resolved()
    again = config_record(cfg)
    for name in [*recorded, *(k for k in again if k not in recorded)]:
        if again.get(name) != recorded.get(name):
            raise ScenarioError(f"{where}: {RUN_TOML} records {name} = {_show(recorded.get(name))}, which the flags "
                                f"of this lbbench run cannot repeat (they give {_show(again.get(name))})")
    _warn_changed_profile(path, doc, cfg)
    return flags


def _warn_changed_profile(path: Path, doc: dict[str, Any], cfg: Any) -> None:
    """Warn when the profile the run names now holds other numbers than it did (the run uses today's)."""
    from ..profiles import ProfileError, load_profile  # lazy: start-up time (profiles read TOML files)

    try:
        now = profile_record(load_profile(cfg.profile))
    except ProfileError:
        return  # the run's checks name it
    was = doc.get("profile", {})
    changed = sorted(k for k in set(now) | set(was) if now.get(k) != was.get(k))
    if was and changed:
        err_console.print(f"[yellow]warning: profile {cfg.profile} differs from the one {path / RUN_TOML} "
                          f"recorded ({', '.join(changed[:6])}{', ...' if len(changed) > 6 else ''}); this run "
                          "uses it as it is now[/yellow]", highlight=False, soft_wrap=True)


def name_the_source(ctx: click.Context, exc: InputError) -> InputError:
    """``exc`` naming where its flag's value came from when that was the scenario file (``FILE: KEY: ...``) or
    the repeated run (``--from RUN_DIR: run.toml's --flag ...``); else ``exc`` itself."""
    flag, sep, rest = user_message(exc).partition(": ")
    p = next((p for p in ctx.command.params if flag in getattr(p, "opts", ())), None) if sep else None
    if p is None or ctx.get_parameter_source(p.name) is not click.core.ParameterSource.DEFAULT_MAP:
        return exc
    layers = ctx.meta.get(_META, {})
    if p.name in layers.get("scenario_file", {}):
        key = next(k for k, q in option_keys(ctx.command).items() if q is p)
        return ScenarioError(f"{ctx.params['scenario_file']}: {key}: {rest}")
    return ScenarioError(f"--from {ctx.params['from_run']}: {RUN_TOML}'s {flag}: {rest}")


# ---------------------------------------------------------------------------------------------- options
def scenario_options(build: Callable[[dict[str, Any]], Any]) -> Callable[[Any], Any]:
    """``--config FILE`` and ``--from RUN_DIR`` on a command; ``build`` turns the command's keyword arguments into
    its ``RunConfig`` (for ``--from``'s check). Both are eager: their values become the defaults of the other
    options before those are parsed."""
    def apply(ctx: click.Context) -> None:
        layers = ctx.meta.get(_META, {})
        ctx.default_map = {**(ctx.default_map or {}), **layers.get("from_run", {}), **layers.get("scenario_file", {})}

    def from_run(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None and not ctx.resilient_parsing:
            ctx.meta.setdefault(_META, {})["from_run"] = repeat_flags(value, ctx, build)
            apply(ctx)
        return value

    def scenario_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None and not ctx.resilient_parsing:
            ctx.meta.setdefault(_META, {})["scenario_file"] = read_scenario(value, ctx)
            apply(ctx)
        return value

    def decorate(f: Any) -> Any:
        f = click.option("--from", "from_run", metavar="RUN_DIR", default=None, is_eager=True,
                         callback=from_run,
                         help="Repeat the run in RUN_DIR: the options its run.toml recorded (the resolved "
                              "config: routers, seeds, rates, workload, profile, ...); flags given here (and "
                              "--config) override them.")(f)
        return click.option("--config", "scenario_file", metavar="FILE.toml", default=None, is_eager=True,
                            callback=scenario_file,
                            help="A scenario file: TOML whose keys are this command's options without the dashes "
                                 "(router = [\"round_robin\", \"jsq\"], rate = 20, seeds = 5, slo = {ttft = 2}); "
                                 "flags given here override it.")(f)
    return decorate
