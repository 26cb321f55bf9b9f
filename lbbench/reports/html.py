"""A self-contained HTML report: tables plus plots embedded as base64 PNGs, no external files.

``to_html`` takes the report's parts (preamble, tables, figures); ``Report.render`` gathers them, so this
module imports neither the report nor the plots.
"""

from __future__ import annotations

import base64
import html as _html
from typing import TYPE_CHECKING, Sequence

from .render import html_table
from .tables import Table

if TYPE_CHECKING:  # pragma: no cover
    from .plots import Plot

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table.report { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
table.report th { background: #2f4f6f; color: #fff; padding: 4px 10px; text-align: left; }
table.report th.group { background: #1d3347; text-align: center; border-left: 2px solid #fff; }
table.report td { border-bottom: 1px solid #ccc; padding: 3px 10px; }
table.report td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.report tbody tr:nth-child(even) { background: #f2f5f8; }
p.note { color: #555; font-size: 0.85em; max-width: 60em; }
ul.runs { font-size: 0.9em; } figure { margin: 1em 0; } figcaption { color: #555; font-size: 0.85em; }
img.plot { max-width: 100%; border: 1px solid #ddd; }
"""


def figure(png: bytes, caption: str) -> str:
    """One PNG as an HTML figure with its caption (inline, base64)."""
    return _img(png, caption)


def page(title: str, body: Sequence[str]) -> str:
    """A self-contained HTML document of ``body`` parts under the report's style."""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _img(png: bytes, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    cap = _html.escape(caption)
    return (f'<figure><img class="plot" alt="{cap}" src="data:image/png;base64,{data}">'
            f"<figcaption>{cap}</figcaption></figure>")


def to_html(preamble: str, tables: Sequence[Table], figures: Sequence["Plot"] = (),
            title: str = "lbbench report") -> str:
    """The whole report as one HTML document: the preamble's ``- `` lines as a list, each table, and the
    figures placed by section (improvement under the main table, then latency, load, a nightly history)."""
    e = _html.escape
    figs = list(figures)
    body = [f"<h1>{e(title)}</h1>", '<ul class="runs">']
    body += [f"<li>{e(line[2:])}</li>" for line in preamble.splitlines()]
    body.append("</ul>")
    for t in tables:
        body.append(html_table(t))
        if t.name == "main":
            body += [_img(f.png, f.caption) for f in figs if f.section == "improvement"]
    for section, heading in (("sweep", "Load sweep"), ("latency", "Latency distributions"),
                             ("load", "Per-instance load"), ("history", "Metrics by night")):
        items = [f for f in figs if f.section == section]
        if items:
            body.append(f"<h2>{heading}</h2>")
            body += [_img(f.png, f.caption) for f in items]
    return page(title, body)
