"""Router registry: snake_case names → router classes with a one-line description.

Every router class is constructed as ``cls(num_instances=..., seed=..., profile=...,
**options)``. Learned routers live in ``lbbench.routers.rl`` and register
themselves when that package is imported; the registry imports it lazily so
heuristic routing never imports it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import InputError
from ..profiles import Profile


class UnknownRouterError(InputError):
    pass


@dataclass(frozen=True)
class RouterInfo:
    name: str
    description: str
    factory: Callable[..., Any]


_REGISTRY: dict[str, RouterInfo] = {}
_LAZY_MODULES = ("lbbench.routers.heuristics", "lbbench.routers.late_binding", "lbbench.routers.rl",
                 "lbbench.routers.cache_aware", "lbbench.routers.cache_length", "lbbench.routers.online_ttft",
                 "lbbench.routers.lookahead",
                 "lbbench.routers.capacity", "lbbench.routers.kv_overlap", "lbbench.routers.token_affinity",
                 "lbbench.routers.predicted_latency", "lbbench.routers.precise_prefix", "lbbench.routers.pd")


def register(name: str, description: str) -> Callable[[Any], Any]:
    def deco(cls: Any) -> Any:
        _REGISTRY[name] = RouterInfo(name, description, cls)
        cls.name = name
        return cls
    return deco


def _load_all() -> None:
    for mod in _LAZY_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:  # optional router family not present
            if exc.name != mod:
                raise


def available_routers() -> dict[str, str]:
    _load_all()
    return {name: info.description for name, info in sorted(_REGISTRY.items())}


#: what a live or proxy backend says when asked to run a router that reads the simulator
ORACLE_REFUSAL = ("{name} is an oracle: it reads true lengths and future arrivals, and runs only on the "
                  "simulator")


def _declares(name: str, flag: str) -> bool:
    _load_all()
    info = _REGISTRY.get(name)
    return bool(info is not None and getattr(info.factory, flag, False))


def needs_simulator(name: str) -> bool:
    """Whether router ``name`` is an oracle that reads the simulator (true lengths, future arrivals)."""
    return _declares(name, "needs_simulator")


#: what a live or proxy backend says when asked to run a router fed by the engines' KV events
KV_EVENTS_REFUSAL = ("{name} reads the instances' KV events: live, give each endpoint's publisher with --kv-events "
                     "tcp://HOST:PORT (vLLM's --kv-events-config, serve-sim --kv-events-port-base)")


def needs_kv_events(name: str) -> bool:
    """Whether router ``name`` must be fed the instances' KV events (``bind_kv_events``)."""
    return _declares(name, "needs_kv_events")


def is_pair_router(name: str) -> bool:
    """Whether router ``name`` routes prefill/decode pairs (``PairDecision``s; it needs a fleet with roles)."""
    _load_all()
    info = _REGISTRY.get(name)
    return bool(info is not None and getattr(info.factory, "pair_router", False))


def get_router(name: str, *, num_instances: int, seed: int = 0, profile: Profile | None = None,
               **options: Any) -> Any:
    _load_all()
    info = _REGISTRY.get(name)
    if info is None:
        known = ", ".join(sorted(_REGISTRY))
        raise UnknownRouterError(f"router: unknown router {name!r} (known: {known})")
    return info.factory(num_instances=num_instances, seed=seed, profile=profile, **options)
