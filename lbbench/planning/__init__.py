"""Capacity planning: the smallest instance count per GPU, the cheapest fleet mix, and the highest rate that
meet an SLO, over derived profiles.

- ``search``: the shared searches: ``min_instances`` (counts), ``max_rate`` (rates, with a bracket),
  ``sequential_attainment`` (paired seeds, stopped once the rest cannot change the decision);
- ``mix``: ``plan --mix``, the cheapest fleet (mixed or uniform) over GPU types, per router;
- ``disagg``: ``plan --disagg``, the cheapest aggregated fleet against the cheapest prefill/decode split on
  ``mix``'s search, checked by full runs and compared at equal cost (``disagg_render``: its JSON and table);
- ``find_rate``: ``run --find-rate``, the highest rate meeting an SLO per router x scheduler;
- ``capacity``: ``PlanConfig`` and ``plan_capacity`` (derive each GPU x TP profile, search on the simulator
  through the one experiment runner, rows);
- ``prices``: the user's price file and the cost columns;
- ``render``: JSON, table, HTML and the attainment picture.
"""

from .capacity import (POINT_COLUMNS, PRICE_COLUMNS, ROW_COLUMNS, Plan, PlanConfig, PlanError, SearchOutcome,
                       plan_capacity)
from .search import SearchResult, TargetNotMetError, min_instances

__all__ = ["POINT_COLUMNS", "PRICE_COLUMNS", "ROW_COLUMNS", "Plan", "PlanConfig", "PlanError", "SearchOutcome",
           "SearchResult", "TargetNotMetError", "min_instances", "plan_capacity"]
