"""The pure summary maths of a run's request rows, on the ground floor: below the runner that writes run
directories (``lbbench.experiment``, ``lbbench.rundir``) and the reports that read them (``lbbench.reports``).

- ``summary``: per-request derived latencies (``derive``) and the per-group summary ``lbbench run`` prints
  (``summarize``, ``per_seed``, ``Slo``);
- ``reference``: the strongest baseline every router is measured against (``with_reference``);
- ``stats``: bootstrap intervals for the change of a statistic between two runs.

Polars and numpy only: nothing here imports another lbbench module but ``lbbench.errors``.
"""
