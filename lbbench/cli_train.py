"""``lbbench train``: train an RL router on the simulator and save its checkpoint.

    lbbench train --router wgrl --profile llama2-7b-v100 --instances 4 \\
        --workload paper-mix --rate 20 --episodes 30 --out DIR [--seed 0] [--requests 2000]

Every ``TrainConfig`` field is a flag (``--batch-size``, ``--lr``, ...) whose help
is the field's docstring. ``DIR`` receives ``policy.npz`` (what ``lbbench run
--router wgrl --checkpoint DIR`` loads, numpy only), ``last/policy.npz``,
``curve.parquet`` (the training curve) and ``config.json``. Training needs the
``learn`` extra (torch, gymnasium); routing with the result does not.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import click

from .routers.rl.config import TrainConfig, field_help

_SPECIAL = {"chunked_prefill"}


def _options(fn):
    """One click option per ``TrainConfig`` field, help from its docstring."""
    helps = field_help()
    for f in reversed(dataclasses.fields(TrainConfig)):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "chunked_prefill":
            fn = click.option(flag, type=click.Choice(["on", "off", "profile"]), default="profile",
                              show_default=True, help=helps[f.name])(fn)
            continue
        if isinstance(f.default, bool):
            fn = click.option(f"{flag}/--no-{flag[2:]}", f.name, default=f.default, show_default=True,
                              help=helps[f.name])(fn)
            continue
        typ = type(f.default)
        if f.name == "router":
            typ = click.Choice(["baseline_rl", "wa_rl", "wgrl"])
        fn = click.option(flag, f.name, type=typ, default=f.default, show_default=True,
                          help=helps[f.name])(fn)
    return fn


@click.command("train")
@_options
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for the checkpoint, training curve and config.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(out_dir: str, quiet: bool, **kw: Any) -> None:
    """Train an RL router (baseline_rl, wa_rl, wgrl) with Double DQN on the simulator."""
    kw["chunked_prefill"] = {"on": True, "off": False, "profile": None}[kw["chunked_prefill"]]
    cfg = TrainConfig(**kw)
    _validate(cfg)
    try:
        from .routers.rl.trainer import train as run_training
    except ModuleNotFoundError as exc:
        raise click.UsageError(f"lbbench train needs {exc.name} (install the 'learn' extra: "
                               "pip install 'lbbench[learn]')") from None
    from .profiles import ProfileError, load_profile
    try:
        profile = load_profile(cfg.profile)
    except ProfileError as exc:
        raise click.BadParameter(str(exc), param_hint="--profile") from None
    t0 = time.perf_counter()
    try:
        curve = run_training(cfg, out_dir, progress=not quiet, profile=profile)
    except ValueError as exc:
        raise click.UsageError(str(exc).splitlines()[0]) from None
    wall_s = time.perf_counter() - t0
    out = Path(out_dir)
    (out / "train_time.json").write_text(json.dumps({"wall_s": round(wall_s, 2)}) + "\n")
    val = curve["val_e2e_s"].drop_nans()
    line = (f"trained {cfg.router} for {cfg.profile} x{cfg.instances}: {cfg.episodes} episodes in "
            f"{wall_s:.0f} s; last episode mean E2E {curve['mean_e2e_s'][-1]:.2f} s")
    if len(val):
        line += f"; exported network: validation mean E2E {val.min():.2f} s"
    click.echo(line)
    click.echo(f"checkpoint: {out / 'policy.npz'}  curve: {out / 'curve.parquet'}")


def _validate(cfg: TrainConfig) -> None:
    checks = [(cfg.instances >= 1, "--instances", "must be >= 1"),
              (cfg.episodes >= 1, "--episodes", "must be >= 1"),
              (cfg.requests >= 1, "--requests", "must be >= 1"),
              (cfg.rate > 0, "--rate", "must be > 0"),
              (cfg.batch_size >= 1, "--batch-size", "must be >= 1"),
              (cfg.buffer_size >= cfg.batch_size, "--buffer-size", "must be >= --batch-size"),
              (0.0 < cfg.gamma < 1.0, "--gamma", "must be in (0, 1)"),
              (cfg.lr > 0, "--lr", "must be > 0"),
              (cfg.max_defer_s > 0, "--max-defer-s", "must be > 0"),
              (cfg.workload in ("paper-mix", "paper_mix"), "--workload",
               f"{cfg.workload!r} is not supported for training (use paper-mix)")]
    for ok, flag, msg in checks:
        if not ok:
            raise click.BadParameter(msg, param_hint=flag)
