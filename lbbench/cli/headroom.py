"""``lbbench headroom``: for a setup, what the oracle planner reaches and how much of it each router captures.

A thin command over ``lbbench.experiment.headroom.run_headroom`` (itself parts of ``run_experiment``): the
setup flags are ``lbbench run``'s; the table, JSON or HTML comes from the headroom table.
"""

from __future__ import annotations

import html
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..distributed import get_executor
from ..experiment import ConfigError
from ..profiles import load_profile
from ..rundir import HEADROOM_FILE
from .flags import ray_option, split_csv
from .run import config_from_flags, run_cmd

_SHOWN = [("mean_e2e_s", "mean E2E (s)"), ("p50_e2e_s", "p50"), ("p99_e2e_s", "p99"),
          ("preemptions", "preempt."), ("mean_router_wait_s", "router wait"),
          ("improvement_vs_round_robin_pct", "vs RR (%)"), ("vs_best_baseline_pct", "vs best (%)"),
          ("headroom_captured", "headroom captured"), ("headroom_captured_reorder", "vs reorder planner"),
          ("mean_ttft_s", "mean TTFT (s)"), ("p99_ttft_s", "p99 TTFT"), ("headroom_captured_ttft", "TTFT headroom")]


def _fmt(col: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if col.startswith("headroom"):
        return f"{100 * v:.0f} %"
    if col.endswith("_pct"):
        return f"{v:+.2f}"
    if isinstance(v, float):
        return f"{v:.3f}" if col.endswith("ttft_s") else (f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}")
    return str(v)


def _cells(row: dict[str, Any]) -> list[str]:
    e2e = _fmt("mean_e2e_s", row["mean_e2e_s"])
    if (row.get("seeds") or 1) > 1 and row.get("mean_e2e_std_s") is not None:
        e2e += f" ± {row['mean_e2e_std_s']:.1f}"
    return [e2e] + [_fmt(c, row.get(c)) for c, _ in _SHOWN[1:]]


def _name(row: dict[str, Any]) -> str:
    sched = "" if row["instance_scheduler"] == "fcfs" else f"/{row['instance_scheduler']}"
    return row["router"] + sched + ("" if row["deployable"] else " (oracle)")


def render_html(rows: list[dict[str, Any]], title: str, notes: list[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ["role", "router", *(label for _, label in _SHOWN)])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in [r["role"], _name(r), *_cells(r)])
                   + "</tr>" for r in rows)
    notes_html = "".join(f"<p>{html.escape(n)}</p>" for n in notes)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:3px 8px;text-align:right}td:first-child,td:nth-child(2){text-align:left}</style></head>"
            f"<body><h1>{html.escape(title)}</h1><table><tr>{head}</tr>{body}</table>{notes_html}</body></html>")


@click.command("headroom")
@click.option("--profile", default=None, help="Profile name or TOML path  [default: llama2-7b-v100].")
@click.option("--instances", type=click.IntRange(min=1), default=None, help="Instances  [default: 4].")
@click.option("--fleet", default=None, metavar="PROFILE:N[,PROFILE:N...]",
              help="A mixed fleet, as `lbbench run --fleet` (replaces --profile and --instances); the planner "
                   "charges each instance its own profile's costs.")
@click.option("--workload", default="paper-mix", show_default=True, help="As `lbbench run --workload`.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None, help="Replay a trace file instead.")
@click.option("--rate", default=None, help="Mean arrival rate in requests/s (default 20; with --trace: rescale).")
@click.option("--requests", type=click.IntRange(min=1), default=None, help="Requests per run (default 2000).")
@click.option("--predictor", default="oracle", show_default=True,
              help="Output-length predictor the routers see (the planner itself reads the true lengths).")
@click.option("--seeds", type=click.IntRange(min=1, max=999), default=5, show_default=True,
              help="Evaluation seeds (paired).")
@click.option("--seed", type=int, default=0, show_default=True, help="First evaluation seed.")
@click.option("--tuning-seeds", type=click.IntRange(min=1), default=2, show_default=True,
              help="Seeds the best classical heuristic is chosen on (first evaluation seed + 1000 on).")
@click.option("--router", "routers", default="", help="Comma-separated lbbench routers to show as well.")
@click.option("--router-opt", "router_opts", multiple=True, metavar="ROUTER.KEY=VALUE",
              help="A router parameter; lookahead.KEY sets the planner (horizon_s, base = backfill_gate | gate | "
                   "a router, k, refresh_s, margin_s, screen_s).")
@click.option("--reorder/--no-reorder", default=True, show_default=True,
              help="Also run the planner that may take any queued request (slower).")
@click.option("--burstiness", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
@click.option("--prefix-caching", type=click.Choice(["profile", "on", "off"]), default="profile", show_default=True,
              help="As `lbbench run --prefix-caching` (the planner's forks keep each instance's cache).")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes the simulated units run in.")
@ray_option
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help=f"Directory (default runs/headroom-<workload>): one run directory per part, {HEADROOM_FILE}.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "html"]), default="table", show_default=True)
@click.pass_context
def headroom(ctx: click.Context, **kw: Any) -> None:
    """How much routing could buy on a setup: round robin, random, the best classical heuristic, the strongest
    router x instance scheduler, the routers asked for, and the oracle planner (lookahead), with the share of
    the planner's headroom each captures: (RR - router) / (RR - planner).

    \b
    Example:
      lbbench headroom --profile llama2-7b-v100 --instances 4 --workload paper-mix --rate 20 --requests 2000
      lbbench headroom --fleet llama3.1-8b-a100:2,llama3.1-8b-l4:2 --rate 60 --requests 500 --seeds 2
    """
    from ..experiment.headroom import run_headroom  # lazy: start-up time (the headroom parts and the planner)

    flags = dict(run_cmd.make_context("run", []).params)  # lbbench run's defaults for what headroom leaves out
    flags.update({k: kw[k] for k in ("profile", "instances", "fleet", "workload", "trace", "rate", "requests",
                                     "predictor", "seeds", "seed", "burstiness", "jobs", "router_opts", "prefix_caching")})
    asked = split_csv(kw["routers"])
    flags["routers"] = ",".join(dict.fromkeys(["round_robin", *asked, *(o.partition(".")[0] for o in
                                                                     kw["router_opts"])]))
    cfg = config_from_flags(flags)
    if any(r in ("lookahead", "lookahead+reorder") for r in asked):
        raise ConfigError("lookahead: the planners are always part of headroom; set them with "
                          "--router-opt lookahead.KEY=VALUE", "routers")
    planner_opts = cfg.router_options.pop("lookahead", {})
    cfg = replace(cfg, routers=[r for r in cfg.routers if r != "lookahead"])
    cfg = cfg.resolved()
    profile = load_profile(cfg.profile)
    cfg.check(profile)
    out = Path(kw["out_dir"] or f"runs/headroom-{Path(cfg.trace).stem if cfg.trace else cfg.workload}")
    with get_executor(kw["jobs"], kw.get("ray_address")) as executor:
        res = run_headroom(cfg, out, routers=asked, num_tuning_seeds=kw["tuning_seeds"],
                           planner_options=planner_opts, reorder=kw["reorder"], executor=executor)
    rows = res.table.to_dicts()
    fleet = cfg.fleet_of(profile)
    setup = f"{cfg.profile} x{cfg.instances}" if fleet.is_uniform else f"fleet {fleet.label}"
    title = (f"headroom: {setup}, {cfg.trace or cfg.workload}, "
             f"{cfg.rate_per_s or 'trace'} req/s, {cfg.requests or 'all'} requests, seeds {cfg.seed}-"
             f"{cfg.seed + cfg.seeds - 1}, predictor {cfg.predictor}" + ("" if res.complete else "  [INCOMPLETE]"))
    notes = [f"best classical heuristic: {res.best_heuristic or '-'}, chosen among the classical heuristics on "
             f"tuning seeds {res.tuning_seeds[0]}-{res.tuning_seeds[-1]} (never the evaluation seeds)",
             f"strongest router x instance scheduler: {res.best_baseline or '-'} (chosen on the evaluation seeds)",
             "lookahead is an oracle planner, not deployable: it sees true lengths and future arrivals; "
             "headroom captured = (RR - router) / (RR - planner) on mean E2E (TTFT: the same on mean TTFT)"]
    if kw["fmt"] == "json":
        click.echo(json.dumps({"title": title, "complete": res.complete, "best_heuristic": res.best_heuristic,
                               "tuning_seeds": res.tuning_seeds, "strongest_combination": res.best_baseline,
                               "rows": rows}, indent=2, default=str))
    elif kw["fmt"] == "html":
        page = render_html(rows, title, notes)
        (out / "headroom.html").write_text(page)
        click.echo(str(out / "headroom.html"))
    else:
        console = Console() if sys.stdout.isatty() else Console(width=220)
        table = Table(title=title)
        table.add_column("role")
        table.add_column("router")
        for _, label in _SHOWN:
            table.add_column(label, justify="right")
        for r in rows:
            table.add_row(r["role"], _name(r), *_cells(r))
        console.print(table)
        for n in notes:
            console.print(n, highlight=False, soft_wrap=True)
        console.print(f"[dim]wrote {out}/{HEADROOM_FILE} and one run directory per part[/dim]")
    if not res.complete:
        ctx.exit(130)
