"""``lbbench train``: train an RL router on the simulator and save its checkpoint.

    lbbench train --router wgrl --profile llama2-7b-v100 --instances 4 \\
        --workload paper-mix --rate 20 --out DIR
    lbbench train --recipe paper --router wgrl --predictor noisy:0.79 --episodes 30 --out DIR
    lbbench train --router wgrl --profile llama3.1-8b-a100 --trace FILE [trace flags] \\
        --rate 8 --predictor metadata:DIR --episodes 30 --out DIR

Every ``TrainConfig`` field is a flag (``--batch-size``, ``--lr``, ...) whose help
is the field's docstring; the trace flags are those of ``lbbench run``. ``--recipe``
(shown first) picks the settings the other flags start from: ``imitation``, the
default, is the shipped checkpoints' recipe (``config.RECIPES``); ``paper`` the
flags' own defaults. A flag given on the command line overrides the recipe. ``DIR``
receives ``policy.npz`` (what ``lbbench run --router wgrl --checkpoint DIR``
loads, numpy only), ``last/policy.npz``, ``curve.parquet`` (the training curve),
``config.json``, ``train_time.json`` and the learning curve (``learning_curve.parquet``
and ``learning_curve.png``: the network against its guidance heuristic and round robin on
validation workloads every ``--eval-every`` episodes). ``--workers N`` collects rollouts in
N processes (``--ray``: Ray actors); ``--teacher kv_gate --bc-episodes B --dagger-rounds D``
(the imitation recipe) warm-starts the network by imitation before Double-DQN fine-tuning.
``--fleet SPEC`` trains on a mixed fleet (``lbbench run --fleet``'s spec; it sets ``--profile``
and ``--instances``), best with ``--capacity-features`` and a capacity-aware teacher
(``--teacher least_work_speed``). Training needs the ``learn`` extra
(torch, gymnasium); routing with the result does not.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import click
import polars as pl
from click.core import ParameterSource

from ..experiment import WORKLOADS
from ..fleet import FleetError
from ..profiles import ProfileError, load_profile
from ..training.config import RECIPES, TrainConfig, field_help
from ..errors import InputError
from .flags import ray_option
from .trace import split_trace_options, trace_transform_options

_CHOICES = {"router": ["baseline_rl", "wa_rl", "wgrl"], "discount": ["time", "decision"],
            "guidance_schedule": ["fading", "literal"], "estimator": ["paper", "interference"],
            "teacher": ["none", "kv_gate", "lookahead", "least_work_speed", "jsq_speed"],
            "guidance": ["mixing", "kv_gate", "lookahead", "least_work_speed", "jsq_speed"]}


def _options(fn):
    """One click option per ``TrainConfig`` field, help from its docstring."""
    helps = field_help()
    for f in reversed(dataclasses.fields(TrainConfig)):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "trace_options":
            continue  # filled from the trace flags
        if f.name == "chunked_prefill":
            fn = click.option(flag, type=click.Choice(["on", "off", "profile"]), default="profile",
                              show_default=True, help=helps[f.name])(fn)
            continue
        if f.name == "fleet":
            fn = click.option(flag, "fleet", type=str, default=None, metavar="SPEC", help=helps[f.name])(fn)
            continue
        if f.name == "trace":
            fn = click.option(flag, "trace", type=click.Path(dir_okay=False), default=None,
                              help=helps[f.name])(fn)
            continue
        if isinstance(f.default, bool):
            fn = click.option(f"{flag}/--no-{flag[2:]}", f.name, default=f.default, show_default=True,
                              help=helps[f.name])(fn)
            continue
        typ = click.Choice(_CHOICES[f.name]) if f.name in _CHOICES else type(f.default)
        fn = click.option(flag, f.name, type=typ, default=f.default, show_default=True,
                          help=helps[f.name])(fn)
    return fn


def _trace_flags(fn):
    return trace_transform_options(fn)


def _recipe_help() -> str:
    def flag(name: str, value) -> str:
        opt = name.replace("_", "-")
        if isinstance(value, bool):
            return f"--{opt}" if value else f"--no-{opt}"
        return f"--{opt} {value}"
    sets = " ".join(flag(k, v) for k, v in RECIPES["imitation"].items())
    return ("Settings the other flags start from (a flag given overrides them): imitation = the shipped "
            f"checkpoints' recipe, a teacher, behaviour cloning, DAgger, then Double DQN ({sets}); "
            "paper = every flag's own default (the paper's formulation, no teacher).")


@click.command("train")
@click.option("--recipe", type=click.Choice(list(RECIPES)), default=next(iter(RECIPES)), show_default=True,
              help=_recipe_help())
@_options
@_trace_flags
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for the checkpoint, training curve and config.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@ray_option
def train(out_dir: str, quiet: bool, recipe: str, ray_address: str | None = None, **kw: Any) -> None:
    """Train an RL router (baseline_rl, wa_rl, wgrl) with Double DQN on the simulator."""
    read, transform = split_trace_options(kw)
    ctx = click.get_current_context()
    kw.update({k: v for k, v in RECIPES[recipe].items()
               if ctx.get_parameter_source(k) in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)})
    kw["chunked_prefill"] = {"on": True, "off": False, "profile": None}[kw["chunked_prefill"]]
    kw["trace"] = kw["trace"] or ""
    trace_options = {k: v for k, v in {**read, **transform}.items() if v not in (None, False)}
    trace_options.setdefault("prompt_overflow", "filter")
    cfg = TrainConfig(**kw, trace_options=trace_options if kw["trace"] else {})
    _validate(cfg)
    try:
        from ..training.rounds import train as run_training  # lazy: torch and gymnasium are the optional learn extra
    except ModuleNotFoundError as exc:
        raise click.UsageError(f"lbbench train needs {exc.name} (install the 'learn' extra: "
                               "pip install 'lbbench[learn]')") from None
    if cfg.fleet:
        try:
            cfg = cfg.for_fleet()
        except FleetError as exc:
            raise click.BadParameter(str(exc).removeprefix("fleet: "), param_hint="--fleet") from None
    try:
        profile = load_profile(cfg.profile)
    except ProfileError as exc:
        raise click.BadParameter(str(exc).removeprefix("profile: "), param_hint="--profile") from None
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        curve = run_training(cfg, out_dir, progress=not quiet, profile=profile, ray_address=ray_address)
    except InputError as exc:  # e.g. --ray without the ray extra, or an unreachable cluster
        raise click.BadParameter(str(exc), param_hint="--ray") from None
    except ValueError as exc:
        field = str(exc).split(":", 1)[0]
        if field in _FIELD_FLAGS:
            raise click.BadParameter(str(exc).split(":", 1)[1].strip(), param_hint=_FIELD_FLAGS[field]) from None
        raise
    wall_s = time.perf_counter() - t0
    out = Path(out_dir)
    # CPU time of this process (the learner; rollout workers' CPU is not counted)
    (out / "train_time.json").write_text(json.dumps({"wall_s": round(wall_s, 2),
                                                     "learner_cpu_s": round(time.process_time() - c0, 2),
                                                     "workers": cfg.workers}) + "\n")
    val = curve["val_e2e_s"].drop_nans()
    where = f"fleet {cfg.fleet}" if cfg.fleet else f"{cfg.profile} x{cfg.instances}"
    line = (f"trained {cfg.router} for {where} on {cfg.workload_label()}: "
            f"{curve.height} episodes in {wall_s:.0f} s; last episode mean E2E {curve['mean_e2e_s'][-1]:.2f} s")
    if len(val):
        line += f"; exported network: validation mean E2E {val.min():.2f} s"
    click.echo(line)
    from ..routers.rl.policy import load_policy  # lazy: start-up time (the RL policy stack)
    meta = load_policy(out).meta
    v = meta.get("validation")
    if v:
        uses = (f"its guidance heuristic (the network did not beat it by {v.get('margin_pct', 0):g} %)"
                if meta.get("gate") == "heuristic" else "the network")
        click.echo(f"validation gate on fresh seeds: network {v['network_e2e_s']:.2f} s, guidance heuristic "
                   f"{v['heuristic_e2e_s']:.2f} s mean E2E; the checkpoint routes with {uses}")
    lc = out / "learning_curve.parquet"
    if lc.is_file():
        last = pl.read_parquet(lc).filter(pl.col("episode") == pl.col("episode").max())
        vals = {r["policy"]: r["mean_e2e_s"] for r in last.iter_rows(named=True)}
        click.echo(f"learning curve (validation workloads, episode {last['episode'][0]}): network "
                   f"{vals['network']:.2f} s, heuristic {vals['heuristic']:.2f} s, round robin "
                   f"{vals['round_robin']:.2f} s mean E2E -> {lc}")
        if not (out / "learning_curve.png").is_file():
            click.echo("no learning_curve.png: the picture needs the plot extra (pip install 'lbbench[plot]')")
    click.echo(f"checkpoint: {out / 'policy.npz'}  curve: {out / 'curve.parquet'}")


_FIELD_FLAGS = {"teacher": "--teacher", "workers": "--workers", "guidance": "--guidance"}


def _rates_ok(cfg: TrainConfig) -> bool:
    try:
        cfg.rate_list()
    except ValueError:
        return False
    return True


def _validate(cfg: TrainConfig) -> None:
    workload_ok = cfg.workload in WORKLOADS or cfg.workload.startswith("dataset:")
    checks = [(cfg.instances >= 1, "--instances", "must be >= 1"),
              (cfg.episodes >= 1, "--episodes", "must be >= 1"),
              (cfg.requests >= 1, "--requests", "must be >= 1"),
              (cfg.rate > 0 or (cfg.trace and cfg.rate == 0), "--rate",
               "must be > 0 (0 keeps a trace's own rate)"),
              (_rates_ok(cfg), "--rates", f"{cfg.rates!r}: give comma-separated rates, each > 0"),
              (cfg.batch_size >= 1, "--batch-size", "must be >= 1"),
              (cfg.buffer_size >= cfg.batch_size, "--buffer-size", "must be >= --batch-size"),
              (0.0 < cfg.gamma < 1.0, "--gamma", "must be in (0, 1)"),
              (cfg.lr > 0, "--lr", "must be > 0"),
              (cfg.n_step >= 1, "--n-step", "must be >= 1"),
              (cfg.max_defer_s >= 0, "--max-defer-s", "must be >= 0 (0: never defer while an instance is up)"),
              (cfg.network in ("mlp", "shared"), "--network", f"{cfg.network!r} is not one of mlp, shared"),
              (cfg.workers >= 0, "--workers", "must be >= 0"),
              (cfg.eval_every >= 1, "--eval-every", "must be >= 1"),
              (cfg.teacher != "none" or not (cfg.bc_episodes or cfg.dagger_rounds), "--teacher",
               "behaviour cloning (--bc-episodes) and DAgger (--dagger-rounds) need a teacher (kv_gate or "
               "lookahead); --recipe paper trains without them"),
              (not cfg.trace or Path(cfg.trace).is_file(), "--trace", f"{cfg.trace}: no such file"),
              (workload_ok, "--workload", f"unknown workload {cfg.workload!r} (choose from "
                                          f"{', '.join(WORKLOADS)}, dataset:FILE, or give --trace FILE)")]
    for ok, flag, msg in checks:
        if not ok:
            raise click.BadParameter(msg, param_hint=flag)
