"""lbbench.reports: Polars tables, comparisons, plots and HTML over run directories.

Run directories are read through ``lbbench.rundir`` (lazy scans of many, and the grouping decided from their
settings); the summary maths and the bootstrap are ``lbbench.metrics``'s. Here:

- ``tables`` / ``render`` / ``report``: the paper's tables and the latency detail, rendered
  as a console table, Markdown, JSON or HTML (``html``, with ``plots``);
- ``compare``: the run-to-run regression gate;
- ``decisions``: the report's section on routing decisions;
- ``synthetic``: plausible request tables for tests and demos (not a simulator).
"""
