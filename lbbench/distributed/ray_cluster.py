"""Joining a Ray cluster for ``--ray``: the one place lbbench imports Ray, lazily.

Ray is an optional extra (``pip install 'lbbench[ray]'``); nothing else in the package imports it at module
level. ``connect(address)`` resolves what a user gave to ``--ray``:

- ``"auto"`` (``--ray`` alone): the cluster named by ``$RAY_ADDRESS`` if set; otherwise a running cluster on
  this machine (one started with ``ray start --head``), and when none is found a local instance started here;
- an explicit address (``HEAD:6379`` or ``ray://HEAD:10001``): that cluster, or an error naming it;
- ``None``: ``$RAY_ADDRESS`` when set, otherwise as ``"auto"``.

It is idempotent: when Ray is already initialised in this process (a caller's own ``ray.init``), it is used as
it is. ``shutdown()`` disconnects only what ``connect`` itself initialised.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Any

from ..errors import InputError

#: the ``RunConfig``-style field name of ``--ray`` (``lbbench.cli.flags`` maps it to the flag)
FIELD = "ray"
EXTRA_HINT = "needs the ray extra: pip install 'lbbench[ray]'"

_initialised_here = False


def require_ray() -> ModuleType:
    """The ``ray`` module, or an ``InputError`` naming the extra that provides it."""
    try:
        import ray
    except ImportError:
        raise InputError(EXTRA_HINT, FIELD) from None
    return ray


def connect(address: str | None = "auto", **init_kwargs: Any) -> None:
    """Connect this process to a Ray cluster (see the module docstring for ``address``).

    ``init_kwargs`` go to ``ray.init`` (tests pass ``num_cpus``); they apply only when a local instance is
    started. Raises ``InputError`` (field ``ray``) when the extra is missing or the named cluster cannot be
    reached.
    """
    global _initialised_here
    ray = require_ray()
    if ray.is_initialized():
        return
    env = os.environ.get("RAY_ADDRESS") or None
    named = env if address in (None, "auto") else address
    opts: dict[str, Any] = {"logging_level": logging.WARNING, "include_dashboard": False}
    if named:
        try:
            ray.init(address=named, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"{named} (from RAY_ADDRESS)" if named == env and address in (None, "auto") else named
            raise InputError(f"cannot reach the Ray cluster at {where}: {str(exc).splitlines()[0]}",
                             FIELD) from None
        _initialised_here = True
        return
    try:
        ray.init(address="auto", logging_level=logging.WARNING)
    except ConnectionError:  # no cluster running on this machine: start a local one for this process
        ray.init(**{**opts, **init_kwargs})
    _initialised_here = True


def shutdown() -> None:
    """Disconnect from (and stop, when it was started here) the cluster ``connect`` joined; else nothing."""
    global _initialised_here
    if not _initialised_here:
        return
    import ray
    ray.shutdown()
    _initialised_here = False


def cluster_cpus() -> int:
    """CPUs the connected cluster offers (at least 1)."""
    import ray
    return max(1, int(ray.cluster_resources().get("CPU", 1)))
