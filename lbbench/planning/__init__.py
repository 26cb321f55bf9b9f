"""Capacity planning: the smallest instance count per GPU that meets an SLO, over derived profiles.

- ``search``: the exponential probe + bisection + monotonicity check over instance counts;
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
