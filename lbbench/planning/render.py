"""A capacity plan as JSON, a console table, a self-contained HTML page, and its picture (PNG bytes).

The picture: SLO attainment against instance count, one line per GPU x TP (x router, x instance scheduler
when several are planned), through every count the search evaluated; the chosen count is ringed and the
target is a dashed line. The x axis is base-2 logarithmic once counts pass 16 (the probe doubles).
"""

from __future__ import annotations

import base64
import html as _html
import io
import json
from typing import Any

from rich.table import Table

from ..reports.html import _CSS
from ..reports.render import cell
from .capacity import PRICE_COLUMNS, ROW_COLUMNS, Plan

WHAT = ("Profiles are physics-derived (lbbench profile derive: vLLM V1 with chunked prefill, a roofline of the model "
        "config and the GPU table) with efficiency factors calibrated on public measured vLLM runs on H100 (mean E2E "
        "within 12 % on them; docs/fidelity.md); every count is simulated, and nothing here was measured on these "
        "GPUs: other GPUs than H100 carry the H100 calibration (an L40S check ran 46 % fast on TPOT).")

_HEADERS = {
    "gpu": "GPU", "tp": "TP", "router": "router", "instance_scheduler": "scheduler", "instances": "instances",
    "gpus": "GPUs",
    "attainment": "attainment", "attainment_at_fewer": "at n-1", "goodput_per_s": "goodput/s",
    "mean_e2e_s": "mean E2E (s)", "p99_e2e_s": "p99 E2E (s)", "mean_ttft_s": "mean TTFT (s)",
    "p99_ttft_s": "p99 TTFT (s)", "mean_tbt_s": "mean TBT (s)", "usd_per_hour": "USD/h",
    "usd_per_million_tokens": "USD/M tokens",
}
_SHOWN = ("gpu", "tp", "router", "instance_scheduler", "instances", "gpus", "attainment", "attainment_at_fewer",
          "goodput_per_s", "mean_e2e_s", "p99_e2e_s", "mean_ttft_s", "p99_ttft_s")


def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and v != v else v


def plan_dict(plan: Plan) -> dict[str, Any]:
    """Everything ``--format json`` prints and ``plan.json`` holds."""
    points = [{**o.key, "instances": n, **{k: _clean(v) for k, v in p.items()},
               "chosen": o.result is not None and n == o.result.instances}
              for o in plan.outcomes for n, p in o.points.items()]
    return {"config": plan.config, "what": WHAT, "complete": plan.complete, "wall_s": round(plan.wall_s, 3),
            "rows": [{k: _clean(v) for k, v in r.items()} for r in plan.rows], "skipped": plan.skipped,
            "points": points, "profiles": plan.profiles}


def to_json(plan: Plan) -> str:
    return json.dumps(plan_dict(plan), indent=2)


def _columns(plan: Plan) -> list[str]:
    cols = [c for c in _SHOWN if c in ROW_COLUMNS]
    if len({r["instance_scheduler"] for r in plan.rows}) <= 1:
        cols.remove("instance_scheduler")
    if plan.rows and "usd_per_hour" in plan.rows[0]:
        cols += list(PRICE_COLUMNS)
    return cols


def fmt(col: str, v: Any) -> str:
    if v is None:
        return "-"
    if col in ("attainment", "attainment_at_fewer"):
        return f"{100 * v:.1f} %"
    if col == "usd_per_hour":
        return f"{v:.2f}"
    return cell(v)


def title(plan: Plan) -> str:
    c = plan.config
    slo = ", ".join(f"{k.removesuffix('_s').upper()} <= {v:g} s" for k, v in c["slo"].items())
    traffic = f"trace {c['trace']}" if c["trace"] else c["workload"]
    rate = f"{c['rate_per_s']:g} req/s" if c["rate_per_s"] else "the trace's rate"
    return (f"{c['model']}: instances needed for {traffic} at {rate} with {100 * c['attainment']:g} % of "
            f"requests within {slo}")


def print_table(plan: Plan, console: Any) -> None:
    cols = _columns(plan)
    table = Table(title=title(plan) + ("" if plan.complete else "  [INCOMPLETE]"))
    for c in cols:
        table.add_column(_HEADERS[c], justify="left" if c in ("gpu", "router", "instance_scheduler") else "right")
    for r in plan.rows:
        table.add_row(*[fmt(c, r.get(c)) + ("*" if c == "instances" and not r["monotone"] else "") for c in cols])
    console.print(table)
    if any(not r["monotone"] for r in plan.rows):
        console.print("* attainment was not monotone in the instance count there; every smaller count was "
                      "simulated and the smallest that met the target is shown")
    console.print(f"[dim]{WHAT} attainment = share of requests with TTFT and mean TBT within the limits; "
                  f"at n-1 = with one instance fewer.[/dim]", highlight=False)


def attainment_png(plan: Plan) -> bytes:
    """The plan's picture (see the module docstring) as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib is the optional plot extra
    from matplotlib.figure import Figure  # lazy: matplotlib is the optional plot extra

    fig = Figure(figsize=(7.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    routers = {o.key["router"] for o in plan.outcomes}
    scheds = {o.key["instance_scheduler"] for o in plan.outcomes}
    top = 1
    markers = "osD^vP*X"
    count = len(plan.outcomes)
    for i, o in enumerate(plan.outcomes):
        k = o.key
        label = f"{k['gpu']} TP {k['tp']}" + (f" {k['router']}" if len(routers) > 1 else "") \
            + (f" {k['instance_scheduler']}" if len(scheds) > 1 else "")
        xs = sorted(o.points)
        ys = [o.points[n]["attainment"] or 0.0 for n in xs]
        top = max(top, *xs)
        size = 4 + min(6.0, 1.5 * (count - 1 - i))  # earlier lines larger: coinciding points stay visible
        color = f"C{i % 10}"
        if o.result is not None:
            label += f": {o.result.instances}"
        ax.plot(xs, ys, marker=markers[i % len(markers)], ms=size, label=label, color=color, zorder=2 + i)
        if o.result is not None:
            ax.plot([o.result.instances], [o.result.attainment], marker="o", ms=size + 8, mfc="none",
                    mec=color, mew=2, zorder=2 + i)
    ax.axhline(plan.config["attainment"], ls="--", color="0.4", lw=1,
               label=f"target {100 * plan.config['attainment']:g} %")
    if top > 16:
        from matplotlib.ticker import FormatStrFormatter  # lazy: matplotlib is the optional plot extra
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    else:
        ax.set_xticks(range(1, top + 1))
    ax.set_xlabel("instances")
    ax.set_ylabel("SLO attainment (share of requests)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", title="GPU TP: planned count", title_fontsize=8)
    ax.set_title("SLO attainment against instance count (ringed: the planned count)", fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def to_html(plan: Plan, png: bytes | None = None) -> str:
    """The plan as one self-contained HTML document (table, picture, what the numbers are)."""
    e = _html.escape
    cols = _columns(plan)
    head = "".join(f"<th>{e(_HEADERS[c])}</th>" for c in cols)
    body = "".join("<tr>" + "".join(
        f'<td class="{"" if c in ("gpu", "router", "instance_scheduler") else "num"}">{e(fmt(c, r.get(c)))}</td>'
        for c in cols) + "</tr>" for r in plan.rows)
    png = png if png is not None else attainment_png(plan)
    img = base64.b64encode(png).decode("ascii")
    c = plan.config
    items = [f"workload: {e(str(c['trace'] or c['workload']))}, {c['requests'] or 'all'} requests, "
             f"{c['seeds']} seed(s) from {c['seed']} (paired: every count sees the same requests)",
             f"routers: {e(', '.join(c['routers']))}; instance schedulers: {e(', '.join(c['instance_schedulers']))}",
             f"searched 1..{c['max_instances']} instances; {e(WHAT)}"]
    items += [e(s) for s in plan.skipped]
    if not plan.complete:
        items.append("<b>incomplete</b>: the plan was interrupted; rows shown are the searches that finished")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>lbbench plan</title>"
            f"<style>{_CSS}</style></head><body>\n<h1>lbbench plan</h1>\n<p>{e(title(plan))}</p>\n"
            '<ul class="runs">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>\n"
            f'<table class="report"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>\n'
            '<p class="note">attainment: share of requests that completed with TTFT and their own mean time '
            "between tokens within the limits (failed requests are misses), per seed, averaged; at n-1: the "
            "same with one instance fewer (0 instances serve nothing).</p>\n"
            f'<figure><img class="plot" alt="SLO attainment against instances" src="data:image/png;base64,{img}">'
            "<figcaption>SLO attainment against instance count per GPU; ringed: the planned count; dashed: "
            "the target.</figcaption></figure>\n</body></html>\n")
