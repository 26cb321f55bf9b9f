"""Joining a Ray cluster for ``--ray``: the one place lbbench imports Ray, lazily.

Ray is an optional extra (``pip install 'lbbench[ray]'``): ``require_ray()`` imports it (or says which extra
is missing) and every other use in the package — the executors' tasks, the actor pools — goes through it.
``connect(address)`` resolves what a user gave to ``--ray``:

- ``"auto"`` (``--ray`` alone): the cluster named by ``$RAY_ADDRESS`` if set; otherwise a running cluster on
  this machine (one started with ``ray start --head``), and when none is found a local instance started here;
- an explicit address (``HEAD:6379`` or ``ray://HEAD:10001``): that cluster, or an error naming it;
- ``None``: ``$RAY_ADDRESS`` when set, otherwise as ``"auto"``.

It is idempotent: when Ray is already initialised in this process (a caller's own ``ray.init``), it is used as
it is. ``shutdown()`` disconnects only what ``connect`` itself initialised.

Token authentication (Ray 2.5x+: ``ray start --head`` turns it on when this machine holds a token): Ray sends
this machine's token to a cluster it finds by itself, never to an address it is given (``--ray HOST:PORT`` or
``RAY_ADDRESS``) unless ``RAY_AUTH_MODE=token`` is set. ``connect`` closes that gap: when the cluster turns
the connection away for want of a token and a token is at hand here (``RAY_AUTH_TOKEN``,
``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``, the file ``ray start --head`` reads), it turns token mode on
for this process, says so in one line on stderr, and connects again.

Two steps of that use Ray's private ``ray._raylet``, because Ray (2.5x-2.6x) has no public API for them:
asking a cluster whether it wants a token without ``ray.init`` (which would retry a refused connection for
minutes; ``GcsClient`` answers at once with ``ray.exceptions.AuthenticationError``, the public exception), and
re-reading ``RAY_AUTH_MODE`` inside a running process (``Config.initialize`` and
``AuthenticationTokenLoader.reset_cache``; Ray reads its settings once, when it is imported). Both only serve
this convenience: with ``RAY_AUTH_MODE=token`` set before lbbench starts, the public ``ray.init`` alone
connects; ``tests/distributed/test_two_nodes.py`` runs the private path against a token cluster.

Clusters started here, as processes (``LocalCluster``: ``start_head``, ``start_worker``, ``stop``): a head
and more nodes on this machine, each a ``ray start ... --block`` child in its own process group, all on one
loopback address, in one temp dir of their own, with their own ports, so that they touch no other Ray on
the machine. Tests and the sweep benchmark use them; on real machines a cluster is started by hand
(``docs/scale-out.md``).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from ..errors import InputError

#: the ``RunConfig``-style field name of ``--ray`` (``lbbench.cli.flags`` maps it to the flag)
FIELD = "ray"
EXTRA_HINT = "needs the ray extra: pip install 'lbbench[ray]'"

_initialised_here = False


def require_ray() -> ModuleType:
    """The ``ray`` module, or an ``InputError`` naming the extra that provides it."""
    try:
        import ray  # lazy: ray is an optional extra
    except ImportError:
        raise InputError(EXTRA_HINT, FIELD) from None
    return ray


def connect(address: str | None = "auto", **init_kwargs: Any) -> bool:
    """Connect this process to a Ray cluster (see the module docstring for ``address``); True when this call
    initialised Ray, False when it already was.

    ``init_kwargs`` go to ``ray.init`` (tests pass ``num_cpus``); they apply only when a local instance is
    started. A named cluster that asks for a token gets this machine's, said in one line on stderr (module
    docstring). Raises ``InputError`` (field ``ray``) when the extra is missing, the named cluster cannot be
    reached, or it asks for a token that is not here or refuses the one that is.
    """
    global _initialised_here
    ray = require_ray()
    if ray.is_initialized():
        return False
    env = os.environ.get("RAY_ADDRESS") or None
    explicit = address not in (None, "auto")
    named = address if explicit else env
    if named:  # Ray retries an unreachable address for minutes: say so at once
        where = named if explicit else f"{env} (from RAY_ADDRESS)"
        _check_reachable(named, where)
        _check_token(named, where)
    try:
        # "auto" lets Ray read RAY_ADDRESS itself; Ray sends this machine's token by itself only to a cluster it
        # finds on this machine, never to a named one (argument or RAY_ADDRESS): _check_token has seen to that
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
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError(f"{where} is not auto, HOST:PORT or ray://HOST:PORT", FIELD)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise InputError(f"cannot reach the Ray cluster at {where}: {exc.strerror or exc}", FIELD) from None


def token_source() -> str | None:
    """Where Ray would read a token on this machine (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``'s file, or
    ``~/.ray/auth_token``, the file ``ray start --head`` uses), or None when there is none."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return "the file in RAY_AUTH_TOKEN_PATH" if Path(path).is_file() else None
    return "~/.ray/auth_token" if (Path.home() / ".ray" / "auth_token").is_file() else None


def _asks_for_token(address: str) -> bool:
    """Whether the cluster at ``address`` turns this process away for want of (the right) token."""
    from ray._raylet import GcsClient  # lazy: ray is an optional extra; private (no public probe: module docstring)
    AuthenticationError = require_ray().exceptions.AuthenticationError

    saved = os.dup(2)  # Ray's C++ client logs the refusal on stderr: this is a question, not an error
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            GcsClient(address=address.split("://", 1)[-1])
    except AuthenticationError:
        return True
    except Exception:  # anything else is ray.init's to report
        return False
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return False


def _enable_token_mode() -> None:
    """``RAY_AUTH_MODE=token`` for this process (and the processes it starts), as Ray itself does it."""
    # lazy: ray is an optional extra; private (no public way to re-read the settings: module docstring)
    from ray._raylet import AuthenticationTokenLoader, Config

    os.environ["RAY_AUTH_MODE"] = "token"
    Config.initialize("")  # Ray reads its settings once: read them again
    AuthenticationTokenLoader.instance().reset_cache()


def _check_token(address: str, where: str) -> None:
    """Turn token mode on (one line on stderr) when the cluster asks for a token and one is at hand here; an
    ``InputError`` when it asks and none is, or the one given is refused."""
    if address.startswith("ray://") or not _asks_for_token(address):
        return
    source = token_source()
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" or source is None:
        problem = ("refused this machine's token (" + source + ")" if source and os.environ.get("RAY_AUTH_MODE")
                   else "uses token authentication and no token is set here")
        raise InputError(f"the Ray cluster at {where} {problem}: set RAY_AUTH_MODE=token and give the head's "
                         "token (RAY_AUTH_TOKEN, or its ~/.ray/auth_token copied here)", FIELD)
    _enable_token_mode()
    print(f"lbbench: the Ray cluster at {where} uses token authentication; using the token from {source} "
          "(RAY_AUTH_MODE=token)", file=sys.stderr, flush=True)
    if _asks_for_token(address):
        raise InputError(f"the Ray cluster at {where} refused the token from {source}: give the head's token "
                         "(RAY_AUTH_TOKEN, or its ~/.ray/auth_token copied here)", FIELD)


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
    require_ray().shutdown()
    _initialised_here = False


def cluster_cpus() -> int:
    """CPUs the connected cluster offers (at least 1)."""
    return max(1, int(require_ray().cluster_resources().get("CPU", 1)))


def node_address() -> str:
    """This node's IP address in the connected cluster (where its Ray workers reach this process)."""
    return require_ray().util.get_node_ip_address()


def current_node_id() -> str | None:
    """The id of the Ray node this process runs on when it is a Ray worker (a task or an actor), else None
    (Ray is not even imported then)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def node_names() -> dict[str, str]:
    """The name of each node of the connected cluster (alive or dead), by node id: its ``lbbench-node:NAME``
    resource (``LocalCluster`` nodes), else its address, with the start of its id when several nodes share one;
    {} when the cluster cannot say (the names are a courtesy: ids stand in for them)."""
    ray = require_ray()
    try:
        nodes = ray.nodes()
    except Exception:
        return {}
    by_address: dict[str, int] = {}
    for n in nodes:
        by_address[n["NodeManagerAddress"]] = by_address.get(n["NodeManagerAddress"], 0) + 1
    names = {}
    for n in nodes:
        tagged = [r[len(NODE_RESOURCE):] for r in n.get("Resources", {}) if r.startswith(NODE_RESOURCE)]
        addr = n["NodeManagerAddress"]
        names[n["NodeID"]] = tagged[0] if tagged else addr if by_address[addr] == 1 else f"{addr}/{n['NodeID'][:8]}"
    return names


# ------------------------------------------------------------------------------------------------ local clusters

#: the address every node of a ``LocalCluster`` uses. Ray (2.x, Linux) replaces ``127.0.0.1`` and ``localhost``
#: by the machine's outward address wherever it is given (``--node-ip-address``, ``--address``, ``ray.init``),
#: so that a node started with them is reachable from other machines; another address of the loopback network
#: (all of 127.0.0.0/8 is the loopback interface) is used as given and keeps every connection on loopback.
LOOPBACK = "127.0.0.2"
#: the custom resource that names a ``LocalCluster`` node (``lbbench-node:NAME`` = 1): records name nodes by it
NODE_RESOURCE = "lbbench-node:"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (on ``host``)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class LocalNode:
    """One ``ray start --block`` process (and, in its process group, everything it started)."""

    name: str
    num_cpus: int
    proc: subprocess.Popen
    log: Path
    head: bool = False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class LocalCluster:
    """A Ray head and more nodes on this machine (``start_head``, ``start_worker``); ``stop()`` ends them all.

    ``address`` is the head's ``HOST:PORT``; ``token_path`` the token file every node reads (token
    authentication on, with a token of the cluster's own, so that nothing in ``~/.ray`` is read or written).
    ``client_env()`` is what a driver on this machine needs to join: ``RAY_ADDRESS`` and the token's path.
    """

    address: str
    temp_dir: Path
    token_path: Path
    nodes: list[LocalNode] = field(default_factory=list)
    owns_temp_dir: bool = True

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0]

    def node_env(self) -> dict[str, str]:
        """The environment of this cluster's ``ray start`` processes."""
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
        env.update({
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path),
            # SIGTERM stops a node at once (Ray 2.5x+ would drain it for 30 s first)
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
            # a node that dies is declared dead within about 3 s, not 30 s: its tasks are retried sooner
            "RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_period_ms": "1000",
            "RAY_health_check_timeout_ms": "1000", "RAY_health_check_failure_threshold": "3",
        })
        return env

    def client_env(self) -> dict[str, str]:
        """What a driver here sets to join with ``--ray auto``: the address and the token's file (not
        ``RAY_AUTH_MODE``: ``connect`` finds that the cluster asks for a token)."""
        return {"RAY_ADDRESS": self.address, "RAY_AUTH_TOKEN_PATH": str(self.token_path)}

    def kill_node(self, node: LocalNode) -> None:
        """Kill a node as a machine dies: SIGKILL to every process of its session (raylet, workers, all)."""
        _kill_session(node.proc, signal.SIGKILL)
        node.proc.wait()

    def stop_node(self, node: LocalNode, timeout_s: float = 30.0) -> None:
        """Stop one node: SIGTERM to its ``ray start`` process, SIGKILL to its group after ``timeout_s``."""
        if node.alive:
            node.proc.terminate()  # `ray start --block` stops its node's processes on SIGTERM
            try:
                node.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        _kill_session(node.proc, signal.SIGKILL)  # whatever did not stop
        if node.proc.poll() is None:
            node.proc.wait()

    def stop(self) -> None:
        """Stop every node (the head last), kill what is left of this cluster's processes and remove its temp
        dir. Idempotent; it never touches another Ray on this machine."""
        for node in reversed(self.nodes):
            self.stop_node(node)
        _kill(_pids_mentioning(str(self.temp_dir)), signal.SIGKILL)  # a process that left its node's group
        if self.owns_temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _pids(match: Callable[[int], bool]) -> list[int]:
    """Processes (Linux ``/proc``; elsewhere none) for which ``match(pid)`` holds; one that ends or cannot be
    read (``OSError``) while it is asked is left out."""
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if match(int(d.name)):
                out.append(int(d.name))
        except OSError:
            continue
    return out


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def session_pids(sid: int) -> list[int]:
    """Processes of session ``sid``: a node's ``ray start`` and all it started (Ray puts its workers in process
    groups of their own, not in sessions of their own)."""
    return _pids(lambda pid: os.getsid(pid) == sid)


def _kill_session(proc: subprocess.Popen, sig: int) -> None:
    _kill(session_pids(proc.pid), sig)  # each node is started in a session of its own


def _pids_mentioning(text: str) -> list[int]:
    """Processes of this user whose command line contains ``text`` (Linux ``/proc``; elsewhere none)."""
    def mentions(pid: int) -> bool:
        return text in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return [p for p in _pids(mentions) if p != os.getpid()]


def _ray_bin() -> str:
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else (shutil.which("ray") or "ray")


def _start_node(cluster: LocalCluster, name: str, num_cpus: int, head: bool, port: int | None,
                resources: dict[str, float] | None, timeout_s: float) -> LocalNode:
    h = cluster.host
    args = [_ray_bin(), "start", "--node-ip-address", h, "--num-cpus", str(num_cpus),
            "--resources", json.dumps({f"{NODE_RESOURCE}{name}": 1, **(resources or {})}),
            "--temp-dir", str(cluster.temp_dir), "--disable-usage-stats", "--block",
            "--dashboard-agent-listen-port", str(free_port(h)), "--metrics-export-port", str(free_port(h)),
            "--runtime-env-agent-port", str(free_port(h))]
    if head:
        args += ["--head", "--port", str(port), "--include-dashboard", "false",
                 "--dashboard-port", str(free_port(h))]
    else:
        args += ["--address", cluster.address]
    log = cluster.temp_dir / f"node-{name}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=cluster.node_env(),
                                start_new_session=True)
    node = LocalNode(name, num_cpus, proc, log, head)
    cluster.nodes.append(node)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "Ray runtime started" in text:
            return node
        if proc.poll() is not None:
            raise RuntimeError(f"ray start for node {name} exited ({proc.returncode}): {text[-1500:]}")
        time.sleep(0.25)
    raise RuntimeError(f"Ray node {name} did not start in {timeout_s:.0f} s: {log.read_text()[-1500:]}")


def start_head(num_cpus: int = 1, *, name: str = "head", host: str = LOOPBACK, port: int | None = None,
               temp_dir: str | Path | None = None, resources: dict[str, float] | None = None,
               timeout_s: float = 120.0) -> LocalCluster:
    """Start a Ray head here (``ray start --head --node-ip-address HOST ... --block``) and return its cluster.

    The head gets ``num_cpus`` CPUs, the resource ``lbbench-node:NAME`` and ``resources``; a temp dir of its
    own (``temp_dir``, default a new one, removed by ``stop``; Ray's socket paths need it short) and free ports
    (``port``: the head's, default a free one). Token authentication is on, with a new token in the temp dir.
    On failure everything started is stopped."""
    own = temp_dir is None
    tdir = Path(tempfile.mkdtemp(prefix="lbray-") if own else temp_dir)
    tdir.mkdir(parents=True, exist_ok=True)
    token = tdir / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    cluster = LocalCluster(f"{host}:{port or free_port(host)}", tdir, token, owns_temp_dir=own)
    try:
        _start_node(cluster, name, num_cpus, True, int(cluster.address.rpartition(":")[2]), resources, timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_worker(cluster: LocalCluster, num_cpus: int = 1, *, name: str | None = None,
                 resources: dict[str, float] | None = None, timeout_s: float = 120.0) -> LocalNode:
    """Start one more node of ``cluster`` here (``ray start --address HEAD --node-ip-address HOST ...``), with
    its own CPUs, the resource ``lbbench-node:NAME`` (default ``node1``, ``node2``, ...) and ``resources``."""
    name = name or f"node{len(cluster.nodes)}"
    return _start_node(cluster, name, num_cpus, False, None, resources, timeout_s)


def stop(cluster: LocalCluster | None) -> None:
    """Stop a cluster ``start_head`` started (``None``: nothing)."""
    if cluster is not None:
        cluster.stop()
