"""Text, Markdown and JSON output of a ``compare.Comparison``."""

from __future__ import annotations

import io
import math
from typing import Any

from .compare import Comparison


def _num(v: float) -> str:
    if v is None or not math.isfinite(v):
        return "–"
    a = abs(v)
    return f"{v:.1f}" if a >= 100 else f"{v:.3f}" if a >= 0.01 else f"{v:.3g}"


def _cells(cmp: Comparison) -> tuple[list[str], list[list[str]]]:
    setting_keys: list[str] = []
    for r in cmp.rows:
        for k in r.settings:
            if k not in setting_keys:
                setting_keys.append(k)
    heads = ["router", *setting_keys, "metric", "baseline", "candidate", "change (%)",
             "CI (%)", "paired", "verdict"]
    rows = []
    for r in cmp.rows:
        c = r.change
        name = r.baseline_router if r.baseline_router == r.candidate_router \
            else f"{r.baseline_router} -> {r.candidate_router}"
        rows.append([name, *[str(r.settings.get(k, "")) for k in setting_keys], r.metric,
                     _num(c.baseline), _num(c.candidate), f"{c.change_pct:+.2f}",
                     f"[{c.ci_low_pct:+.2f}, {c.ci_high_pct:+.2f}]",
                     f"yes ({c.num_seeds} seeds)" if c.paired else "no", r.verdict])
    return heads, rows


def _summary_line(cmp: Comparison) -> str:
    bad = [r for r in cmp.rows if r.regression]
    if bad:
        items = ", ".join(f"{r.candidate_router} {r.metric} worse by {r.worse_pct:.1f}%" for r in bad)
        return (f"REGRESSION: {items} (worse by more than {cmp.max_regression_pct:g}% with the "
                "interval excluding 0)")
    return f"OK: no metric worse by more than {cmp.max_regression_pct:g}% with the interval excluding 0"


def render_comparison(cmp: Comparison, fmt: str) -> Any:
    """``table`` (plain aligned text), ``markdown`` (str) or ``json`` (a dict)."""
    if fmt == "json":
        return {"max_regression_pct": cmp.max_regression_pct, "regressed": cmp.regressed,
                "warnings": cmp.warnings,
                "rows": [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                          for k, v in row.items()} for row in cmp.frame().to_dicts()]}
    heads, rows = _cells(cmp)
    buf = io.StringIO()
    for w in cmp.warnings:
        buf.write(f"warning: {w}\n")
    if fmt == "markdown":
        buf.write("| " + " | ".join(heads) + " |\n|" + "|".join("---" for _ in heads) + "|\n")
        for r in rows:
            buf.write("| " + " | ".join(r) + " |\n")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
                  for i, h in enumerate(heads)]
        buf.write("  ".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip() + "\n")
        buf.write("  ".join("-" * w for w in widths) + "\n")
        for r in rows:
            buf.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")
    buf.write(_summary_line(cmp) + "\n")
    return buf.getvalue()
