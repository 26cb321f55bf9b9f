"""Rendering report tables as text: a rich console table, Markdown, JSON or HTML fragments.

Numbers are formatted per column: seconds and rates get as many decimals as the column's
magnitude needs, percentages one decimal, counts none. The main table folds its
uncertainty into the cells a reader looks at: ``mean ± std`` and ``+x.x [lo, hi]``.
"""

from __future__ import annotations

import html
import io
import json
import math
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table as RichTable

from .tables import Table

HEADERS = {
    "router": "router", "seeds": "seeds", "run": "run", "profile": "profile",
    "chunked_prefill": "chunked prefill", "instance_scheduler": "instance scheduler",
    "mean_e2e_s": "mean E2E (s)", "diff_vs_baseline_s": "diff vs baseline (s)",
    "improvement_pct": "improvement (%) [95% CI]",
    "improvement_vs_baseline_pct": "improvement (%)", "mean_router_wait_s": "mean router wait (s)",
    "mean_ttft_s": "mean TTFT (s)", "p99_ttft_s": "p99 TTFT (s)", "mean_tbt_s": "mean TBT (s)",
    "p99_tbt_s": "p99 TBT (s)", "max_tbt_s": "max TBT (s)", "p50_e2e_s": "p50 E2E (s)",
    "p90_e2e_s": "p90 E2E (s)", "p99_e2e_s": "p99 E2E (s)",
    "throughput_tokens_per_s": "throughput (tok/s)", "preemptions": "preemptions",
    "completed": "completed", "failed": "failed", "dispatch_lag_p50_s": "dispatch lag p50 (s)",
    "dispatch_lag_p99_s": "dispatch lag p99 (s)", "requested_rate_per_s": "requested rate (/s)",
    "achieved_rate_per_s": "achieved rate (/s)", "requests_share_pct": "requests (%)",
    "tokens_share_pct": "tokens (%)", "tokens_imbalance": "tokens max/fair",
    "requests_imbalance": "requests max/fair", "goodput_pct": "goodput (%)",
    "goodput_requests_per_s": "goodput (req/s)", "met_slo": "met SLO",
    "num_instances": "instances", "rate_per_s": "rate (/s)",
}


def cell(v: Any) -> str:
    """A plain cell of a command's own table: '-' for missing, 3 decimals below 10 and 1 from there, else str."""
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def header(col: str) -> str:
    if " | " in col:
        group, metric = col.split(" | ", 1)
        return f"{group}: {header(metric)}"
    return HEADERS.get(col, col.replace("_", " "))


def _decimals(v: float) -> int:
    """Decimals that keep about three significant digits of ``v`` (at least one)."""
    a = abs(v)
    if a == 0 or a >= 100:
        return 1 if a else 2
    if a >= 1:
        return 2
    if a >= 0.01:
        return 3
    return 6


def _fmt(v: Any, decimals: int | None = None, signed: bool = False) -> str:
    """One cell; floats get ``decimals`` or, when None, digits chosen from their size."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        d = _decimals(v) if decimals is None else decimals
        return f"{v:+.{d}f}" if signed else f"{v:.{d}f}"
    return str(v)


def display(table: Table, wide: bool = True) -> tuple[list[str], list[list[str]]]:
    """Headers and string cells of a table as people read it (without ``wide``: less its ``Table.wide``
    columns)."""
    df = table.df
    cols = list(df.columns)
    dec = {c: 1 for c in cols if c.endswith("_pct")}
    skip = {"mean_e2e_std_s", "ci_low_pct", "ci_high_pct", *(() if wide else table.wide)}
    out_cols = [c for c in cols if c not in skip]
    rows = []
    for r in df.iter_rows(named=True):
        cells = []
        for c in out_cols:
            v = r[c]
            if c == "mean_e2e_s" and "mean_e2e_std_s" in r:
                d = _decimals(v) if v is not None else 2
                if r.get("seeds", 2) == 1:  # no spread over seeds to show
                    cells.append(_fmt(v, d))
                else:
                    cells.append(f"{_fmt(v, d)} ± {_fmt(r['mean_e2e_std_s'], d)}")
            elif c == "improvement_pct" and "ci_low_pct" in r:
                s = _fmt(v, 1, signed=True)
                if r["ci_low_pct"] is not None and r["ci_high_pct"] is not None and v != 0:
                    s += f" [{r['ci_low_pct']:+.1f}, {r['ci_high_pct']:+.1f}]"
                cells.append(s)
            elif c == "diff_vs_baseline_s" or c.endswith("improvement_pct"):
                cells.append(_fmt(v, dec.get(c), signed=True))
            else:
                cells.append(_fmt(v, dec.get(c)))
        rows.append(cells)
    return [table.headers.get(c) or header(c) for c in out_cols], rows


def to_markdown(tables: Sequence[Table], title: str | None = None, preamble: str = "") -> str:
    buf = io.StringIO()
    if title:
        buf.write(f"# {title}\n\n")
    if preamble:
        buf.write(preamble.rstrip() + "\n\n")
    for t in tables:
        heads, rows = display(t)
        buf.write(f"## {t.title}\n\n")
        buf.write("| " + " | ".join(heads) + " |\n")
        buf.write("|" + "|".join("---" if i < len(t.keys) else "---:" for i in range(len(heads)))
                  + "|\n")
        for r in rows:
            buf.write("| " + " | ".join(x.replace("|", "\\|") for x in r) + " |\n")
        if t.note:
            buf.write(f"\n{t.note}\n")
        buf.write("\n")
    return buf.getvalue()


def to_rich(tables: Sequence[Table], console: Any = None, preamble: str = "", wide: bool = True) -> None:
    """The tables on a rich console; without ``wide``, each less its ``Table.wide`` columns."""
    console = console or Console()
    if preamble:
        console.print(preamble, markup=False, highlight=False)
    for t in tables:
        heads, rows = display(t, wide)
        rt = RichTable(title=t.title, caption=t.note or None, caption_justify="left")
        for i, h in enumerate(heads):
            rt.add_column(h, justify="left" if i < len(t.keys) else "right")
        for r in rows:
            rt.add_row(*r)
        console.print(rt)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def tables_json(tables: Sequence[Table]) -> dict[str, list[dict[str, Any]]]:
    return {t.name: [{k: _clean(v) for k, v in r.items()} for r in t.df.to_dicts()] for t in tables}


def to_json(tables: Sequence[Table], extra: dict[str, Any] | None = None) -> str:
    doc = dict(extra or {})
    doc["tables"] = tables_json(tables)
    return json.dumps(doc, indent=2, default=str)


def html_table(t: Table) -> str:
    heads, rows = display(t)
    e = html.escape
    parts = [f'<h2>{e(t.title)}</h2>', '<table class="report">', "<thead>"]
    cols = [c for c in t.df.columns if c not in ("mean_e2e_std_s", "ci_low_pct", "ci_high_pct")]
    if any(" | " in c for c in cols):  # column groups (side-by-side tables): two header rows
        groups: list[tuple[str, int]] = []
        for c in cols:
            g = c.split(" | ", 1)[0] if " | " in c else ""
            if groups and groups[-1][0] == g:
                groups[-1] = (g, groups[-1][1] + 1)
            else:
                groups.append((g, 1))
        parts.append("<tr>" + "".join(f'<th colspan="{n}" class="group">{e(g)}</th>'
                                      for g, n in groups) + "</tr>")
        heads = [header(c.split(" | ", 1)[1]) if " | " in c else header(c) for c in cols]
    parts.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in heads) + "</tr>")
    parts.append("</thead><tbody>")
    for r in rows:
        parts.append("<tr>" + "".join(
            f'<td class="{"key" if i < len(t.keys) else "num"}">{e(x)}</td>'
            for i, x in enumerate(r)) + "</tr>")
    parts.append("</tbody></table>")
    if t.note:
        parts.append(f'<p class="note">{e(t.note)}</p>')
    return "\n".join(parts)
