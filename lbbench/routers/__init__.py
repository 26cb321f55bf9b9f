"""Routers: the paper's heuristics, common production policies, learned routers.

A router implements ``route(queue, view, now_s) -> Decision | None`` (see
``lbbench.dispatch.Router``). Use ``get_router(name, num_instances=..., seed=...)``.
"""

from .registry import UnknownRouterError, available_routers, get_router, register

__all__ = ["UnknownRouterError", "available_routers", "get_router", "register"]
