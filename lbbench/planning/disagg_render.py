"""``plan --disagg``'s answer as JSON (``disagg.json``) and as a console table: each layout's cheapest fleet, its
check on held-out seeds, n / n - 1 along each role, goodput per GPU-hour, and both layouts at equal cost."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from .disagg import DisaggPlan
from .mix import _money, fewer_text

WHAT = ("Profiles are physics-derived (vLLM V1, chunked prefill, the shipped calibration) and every fleet is "
        "simulated, not measured. search: the attainment the search decided on (seeds stopped early give the "
        "bound that decided); check: a full run on held-out seeds. One fewer: the attainment with one instance "
        "fewer of each type the fleet holds (each must miss; without its last prefill instance a P/D fleet's decode "
        "instances serve whole; without its last decode instance nothing decodes: no fleet left). "
        "Goodput: requests within the SLO.")


def disagg_dict(plan: DisaggPlan, head: dict[str, Any]) -> dict[str, Any]:
    """Everything ``--format json`` prints and ``DIR/disagg.json`` holds (``head``: what was asked)."""
    return {**head, "kv_link": plan.kv_link, "complete": plan.complete, "wall_s": round(plan.wall_s, 3),
            "chosen": plan.chosen, "what": WHAT,
            "layouts": {k: lay.record(plan.priced) for k, lay in plan.layouts.items()},
            "searches": {"aggregated": [s.record() for s in plan.aggregated],
                         "disaggregated": [s.record() for s in plan.disaggregated]},
            "skipped": plan.skipped}


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _num(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def print_disagg(plan: DisaggPlan, doc: dict[str, Any], title: str, console: Any) -> None:
    """One row per layout, then the choice, the equal-cost comparison and each search's cost."""
    table = Table(title=title + ("" if plan.complete else "  [INCOMPLETE]"))
    cols = ["layout", "router", "cheapest fleet", "cost", "GPUs", "search", "check", "one fewer of each",
            "goodput/s", "goodput/GPU-h"]
    cols += ["goodput/$"] if plan.priced else []
    cols += ["at equal cost", "its check", "its goodput/GPU-h"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("layout", "router", "cheapest fleet", "one fewer of each",
                                                    "at equal cost") else "right")
    for kind, rec in doc["layouts"].items():
        chk, eq = rec["check"] or {}, rec["equal_cost_check"] or {}
        fewer = ", ".join(f"{k}: {fewer_text(a)}" for k, a in rec["attainment_with_one_fewer"].items()) or "-"
        row = [kind + (" (chosen)" if kind == plan.chosen else ""), rec["router"], rec["fleet"],
               _money(rec["cost"], plan.priced), str(rec["gpus"]), _pct(rec["search_attainment"]),
               _pct(chk.get("attainment")), fewer, _num(chk.get("goodput_per_s"), 2),
               _num(rec["goodput_per_gpu_hour"], 0)]
        row += [_num(rec["goodput_per_usd"], 0)] if plan.priced else []
        row += [rec["equal_cost_fleet"], _pct(eq.get("attainment")), _num(rec["equal_cost_goodput_per_gpu_hour"], 0)]
        table.add_row(*row)
    console.print(table)
    for kind, searches in (("aggregated", plan.aggregated), ("disaggregated", plan.disaggregated)):
        for s in searches:
            counts = ", ".join(f"{k} {n if n is not None else 'not met'}" for k, n in s.uniform.items())
            extra = f"; first answers not minimal, replaced: {', '.join(map(s.spec, s.replaced))}" if s.replaced else ""
            console.print(f"{kind} {s.router}: {s.spec(s.best)} ({_money(s.cost(s.best), plan.priced)}); step 1 "
                          f"counts {counts}; {len(s.points)} fleets simulated"
                          f"{', capped' if s.bounded else ''}, {s.wall_s:.1f} s{extra}", highlight=False)
    if plan.chosen is not None:
        console.print(f"[bold]{_verdict(plan, doc)}[/bold]", highlight=False)
    elif plan.complete:
        console.print("[bold]no fleet of either layout met the target within --max-instances: raise it, or relax the "
                      "SLO or the attainment[/bold]", highlight=False)
    console.print(f"[dim]{WHAT}[/dim]", highlight=False)


def _verdict(plan: DisaggPlan, doc: dict[str, Any]) -> str:
    lay = doc["layouts"]
    chosen = lay[plan.chosen]
    text = f"plan: {plan.chosen}, {chosen['fleet']} at {_money(chosen['cost'], plan.priced)}"
    checked = (chosen["check"] or {}).get("attainment")
    if checked is not None and checked < doc["attainment"]:
        text += f" (its check on held-out seeds attains {_pct(checked)}, below the target: add --seeds or --requests)"
    for kind, rec in lay.items():
        if not rec["minimal"]:
            text += (f"; NOT MINIMAL: {kind} still meets with one fewer "
                     f"{', '.join(rec['still_met_with_one_fewer'])}")
    other = next((k for k in lay if k != plan.chosen), None)
    if other is None:
        return text + f" (no {'disaggregated' if plan.chosen == 'aggregated' else 'aggregated'} fleet met the target)"
    o = lay[other]
    text += (f"; {other} needs {o['fleet']} at {_money(o['cost'], plan.priced)}"
             f" ({100 * (o['cost'] / chosen['cost'] - 1):+.1f} %)" if chosen["cost"] else "")
    eq = o["equal_cost_check"]
    if o["equal_cost_fleet"] != "-" and eq is not None:
        text += (f"; at {_money(chosen['cost'], plan.priced)} its best fleet {o['equal_cost_fleet']} meets "
                 f"{_pct(eq.get('attainment'))}")
    else:
        text += f"; it has no fleet at {_money(chosen['cost'], plan.priced)} or less"
    return text
