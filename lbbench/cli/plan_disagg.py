"""``lbbench plan --disagg``: flags -> ``planning.disagg.plan_disagg`` -> a table or JSON.

With ``--out DIR`` every simulated fleet is appended to ``DIR/points.jsonl`` as it completes (layout, router,
fleet, counts, cost, attainment), and ``DIR/disagg.json`` is written at the end, also after Ctrl-C (then
``complete`` is false and the exit code 130).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ..kv_links import DEFAULT_LINK
from ..planning.disagg import DEFAULT_PD_ROUTER, plan_disagg
from ..planning.disagg_render import disagg_dict, print_disagg
from .common import err_console
from .flags import split_csv


def plan_disagg_cmd(cfg: Any, kw: dict[str, Any], out_dir: Path | None) -> None:
    pd_routers = split_csv(kw["pd_routers"]) if kw["pd_routers"] is not None else [DEFAULT_PD_ROUTER]
    kv_link = kw["kv_link"] or DEFAULT_LINK
    points = None if out_dir is None else out_dir / "points.jsonl"
    if points is not None and points.exists():
        points.unlink()  # a fresh plan: points of an earlier one do not mix in

    def note(message: str) -> None:
        err_console.print(message, highlight=False, soft_wrap=True)

    def on_point(kind: str, router: str, spec: str, v: tuple[int, ...], attainment: float) -> None:
        if points is None:
            return
        points.parent.mkdir(parents=True, exist_ok=True)
        with open(points, "a") as f:
            f.write(json.dumps({"layout": kind, "router": router, "fleet": spec, "counts": list(v),
                                "attainment": attainment}) + "\n")

    def on_search(kind: str, s: Any) -> None:
        note(f"{kind} {s.router}: {s.spec(s.best)} ({len(s.points)} fleets simulated, {s.wall_s:.1f} s)")

    plan = plan_disagg(cfg, pd_routers=pd_routers, kv_link=kv_link, max_evaluations=kw["max_evaluations"],
                       min_capacity=kw["min_capacity"],
                       profile_dir=None if out_dir is None else out_dir / "profiles", note=note,
                       on_point=on_point, on_search=on_search)
    head = {"model": cfg.model, "workload": cfg.run.workload, "trace": cfg.run.trace,
            "rate_per_s": cfg.run.rate_per_s, "requests": cfg.run.requests, "seeds": cfg.run.seeds,
            "seed": cfg.run.seed, "slo": kw["slo"], "attainment": cfg.attainment, "gpus": list(cfg.gpus),
            "routers": list(cfg.run.routers), "pd_routers": pd_routers, "price_file": cfg.price_file}
    doc = disagg_dict(plan, head)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "disagg.json").write_text(json.dumps(doc, indent=2) + "\n")
    if kw["fmt"] == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        traffic = f"trace {cfg.run.trace}" if cfg.run.trace else cfg.run.workload
        title = (f"{cfg.model}: aggregated or prefill/decode for {traffic} at {cfg.run.rate_per_s:g} req/s with "
                 f"{100 * cfg.attainment:g} % of requests within {cfg.slo.describe()} (KV link {kv_link})")
        console = Console() if sys.stdout.isatty() else Console(width=240)
        print_disagg(plan, doc, title, console)
        console.print(f"[dim]search: {plan.wall_s:.1f} s[/dim]", highlight=False)
    if not plan.complete:
        sys.exit(130)
