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


def connect(address: str | None = "auto", **init_kwargs: Any) -> bool:
    """Connect this process to a Ray cluster (see the module docstring for ``address``); True when this call
    initialised Ray, False when it already was.

    ``init_kwargs`` go to ``ray.init`` (tests pass ``num_cpus``); they apply only when a local instance is
    started. Raises ``InputError`` (field ``ray``) when the extra is missing or the named cluster cannot be
    reached.
    """
    global _initialised_here
    ray = require_ray()
    if ray.is_initialized():
        return False
    env = os.environ.get("RAY_ADDRESS") or None
    explicit = address not in (None, "auto")
    named = address if explicit else env
    if named:  # Ray retries an unreachable address for minutes: say so at once
        _check_reachable(named, named if explicit else f"{env} (from RAY_ADDRESS)")
    try:
        # "auto" lets Ray read RAY_ADDRESS itself: then (and for a cluster it finds on this machine) Ray also
        # sends this machine's auth token, which it never sends to an address given explicitly
        ray.init(address=address if explicit else "auto", logging_level=logging.WARNING)
    except ConnectionError as exc:
        if explicit or env:
            raise InputError(_unreachable(address if explicit else f"{env} (from RAY_ADDRESS)", exc),
                             FIELD) from None
        # no cluster on this machine: start a local one for this process
        ray.init(**{"address": "local", "logging_level": logging.WARNING, "include_dashboard": False,
                    **init_kwargs})
    except (RuntimeError, ValueError) as exc:
        raise InputError(_unreachable(address if explicit else env or "auto", exc), FIELD) from None
    _initialised_here = True
    return True


def _check_reachable(address: str, where: str, timeout_s: float = 5.0) -> None:
    """An ``InputError`` unless ``address`` (``[ray://]HOST:PORT``) accepts a TCP connection."""
    import socket

    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError(f"{where} is not auto, HOST:PORT or ray://HOST:PORT", FIELD)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise InputError(f"cannot reach the Ray cluster at {where}: {exc.strerror or exc}", FIELD) from None


def _unreachable(where: str | None, exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    hint = ("" if os.environ.get("RAY_AUTH_MODE") else
            "; if it uses token authentication, set RAY_AUTH_MODE=token and give its token (RAY_AUTH_TOKEN)")
    return f"cannot reach the Ray cluster at {where}: {text}{hint}"


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


def node_address() -> str:
    """This node's IP address in the connected cluster (where its Ray workers reach this process)."""
    import ray
    return ray.util.get_node_ip_address()
