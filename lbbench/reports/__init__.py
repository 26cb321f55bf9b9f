"""lbbench.reports: Polars tables, comparisons, plots and HTML over run directories.

- ``summary``: per-request derived latencies and the per-router summary `lbbench run` prints;
- ``load``: lazy scans of many run directories and the grouping decided from their settings;
- ``tables`` / ``render`` / ``report``: the paper's tables and the latency detail, rendered
  as a console table, Markdown, JSON or HTML (``html``, with ``plots``);
- ``stats`` / ``compare``: bootstrap intervals and the run-to-run regression gate;
- ``synthetic``: plausible request tables for tests and demos (not a simulator).
"""
