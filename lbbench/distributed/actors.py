"""Pools of workers that keep state (actors): in this process, in local processes, or as Ray actors.

The executors (``executors.py``) run stateless functions on units; an actor pool holds ``workers`` objects, each
built once by ``factory(*args)`` in its worker (``factory`` and ``args`` are pickled to it), that then serve
method calls and keep their state between them: RL rollout workers (an environment each), load workers.

- ``pool.submit(units, method, *shared)``: ``getattr(worker, method)(*shared, unit)`` for every unit, spread over
  the workers, yielding ``(index, result)`` as calls finish (completion order, as ``Executor.submit``);
- ``pool.call(worker, method, *args)``: one call on one worker, its result;
- ``pool.start(worker, method, *args)``: a long call (it runs until the caller tells its worker to stop by its own
  means), a ``Call`` to poll (``done()``) or wait on (``result()``).

Semantics shared with the executors: a worker serves one call at a time and at most ``max_pending`` calls are in
flight (default: one per worker). A worker that dies is restarted (its factory runs again) and the call it held
retried once; a call whose worker dies a second time raises ``UnitError`` naming the call. A started call is not
retried (its caller handles the loss: a load worker's driver sees its connection close). Leaving a ``submit``
iteration early (Ctrl-C, an error, ``close()`` on the generator) dispatches nothing more; results of calls still
running are dropped when they arrive. Pools are context managers; ``close()`` stops the workers (processes get
``stop_timeout_s`` to finish, then are terminated) and disconnects from a Ray cluster the pool itself joined.

- ``InProcessActors``: one worker per pool here, calls run when sent (the trivial case; a death is this process's);
- ``ProcessActors``: ``spawn`` processes (no state of the caller, torch or an event loop, is inherited), one pipe
  each; the worker ignores SIGINT (the driver decides when calls stop);
- ``RayActors``: Ray actors (``num_cpus`` each) on the cluster ``ray_cluster.connect`` joins.
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
import time
import traceback
from collections import deque
from multiprocessing.connection import wait as wait_ready
from typing import Any, Callable, Iterator, Sequence

from .executors import UnitError, unit_name
from .ray_cluster import connect, require_ray, shutdown


class WorkerDied(Exception):
    """A call's worker died before it answered (``str``: what is known, e.g. its exit code)."""


class Call:
    """A started call: ``done()`` says whether it ended, ``result()`` waits for its result (or raises its error;
    ``UnitError`` when its worker died)."""

    def __init__(self, pool: ActorPool, worker: int, handle: Any, label: str):
        self.pool, self.worker, self.handle, self.label = pool, worker, handle, label
        self._outcome: tuple[bool, Any] | None = None

    def done(self) -> bool:
        return self._outcome is not None or bool(self.pool._ready([self.handle], 0.0))

    def result(self) -> Any:
        if self._outcome is None:
            self.pool._ready([self.handle], None)
            try:
                self._outcome = (True, self.pool._collect(self.worker, self.handle, self.label, retry=False))
            except Exception as exc:
                self._outcome = (False, exc)
        ok, value = self._outcome
        if ok:
            return value
        raise value


class ActorPool:
    """``workers`` stateful workers built by ``factory(*args)``; see the module docstring."""

    name = "actors"

    def __init__(self, factory: Callable[..., Any], args: Sequence[Any] = (), workers: int = 1,
                 max_pending: int | None = None):
        self.factory, self.args = factory, tuple(args)
        self.workers = max(1, workers)
        self.max_pending = max(1, min(max_pending or self.workers, self.workers))
        self._busy: dict[int, Any] = {}  # worker -> the handle of the call it is serving
        self._dead: set[int] = set()  # workers to restart before their next call

    # -- what a backend provides ---------------------------------------------------------------------------------
    def _send(self, worker: int, method: str, args: tuple) -> Any:
        """Start ``method(*args)`` on an idle ``worker``; a handle for ``_ready``/``_result``."""
        raise NotImplementedError

    def _ready(self, handles: list, timeout_s: float | None) -> list:
        """Those of ``handles`` that ended (waiting up to ``timeout_s`` for one; ``None``: as long as it takes)."""
        raise NotImplementedError

    def _result(self, handle: Any) -> Any:
        """An ended call's result; raises its error, or ``WorkerDied``."""
        raise NotImplementedError

    def _restart(self, worker: int) -> None:
        raise NotImplementedError

    def _share(self, values: tuple) -> tuple:
        """Arguments sent with every call of one ``submit`` (Ray puts them in its object store once)."""
        return values

    def _stop(self) -> None:
        pass

    # -- the calls -----------------------------------------------------------------------------------------------
    def _dispatch(self, worker: int, method: str, args: tuple) -> Any:
        if worker in self._dead:
            self._dead.discard(worker)
            self._restart(worker)
        handle = self._send(worker, method, args)
        self._busy[worker] = handle
        return handle

    def _collect(self, worker: int, handle: Any, label: str, retry: bool) -> Any:
        """An ended call's result; ``WorkerDied`` passes when ``retry`` (the caller retries), else ``UnitError``."""
        if self._busy.get(worker) is handle:
            del self._busy[worker]
        try:
            return self._result(handle)
        except WorkerDied as exc:
            self._dead.add(worker)
            if retry:
                raise
            raise UnitError([label], f"its worker died ({exc})") from None

    def _drop(self, worker: int, handle: Any) -> None:
        """Collect an ended call nobody waits for any more, dropping its result or error."""
        try:
            self._collect(worker, handle, "", retry=True)
        except Exception:
            pass

    def submit(self, units: Sequence[Any], method: str, *shared: Any,
               labels: Sequence[str] | None = None) -> Iterator[tuple[int, Any]]:
        """``(index, getattr(worker, method)(*shared, units[index]))`` for every unit, as calls finish."""
        return self._run([(None, u) for u in units], method, shared, labels or [unit_name(u) for u in units])

    def call(self, worker: int, method: str, *args: Any) -> Any:
        """``getattr(worker, method)(*args)`` on worker ``worker``, retried once if the worker dies."""
        return next(self._run([(worker, args)], method, (), [f"worker {worker}"], unpack=True))[1]

    def start(self, worker: int, method: str, *args: Any) -> Call:
        """Start a long call on worker ``worker`` (after the one it is serving, if any); never retried."""
        if worker in self._busy:  # a call an abandoned iteration left running
            self._ready([self._busy[worker]], None)
            self._drop(worker, self._busy[worker])
        return Call(self, worker, self._dispatch(worker, method, args), f"{method} on worker {worker}")

    def _run(self, jobs: list[tuple[int | None, Any]], method: str, shared: tuple, labels: Sequence[str],
             unpack: bool = False) -> Iterator[tuple[int, Any]]:
        todo = deque(range(len(jobs)))
        tries = [0] * len(jobs)
        mine: dict[Any, int] = {}  # handle -> job index
        shared = self._share(shared) if jobs else shared
        try:
            while todo or mine:
                while todo and len(mine) < self.max_pending:
                    pinned = jobs[todo[0]][0]
                    free = [w for w in (range(self.workers) if pinned is None else [pinned]) if w not in self._busy]
                    if not free:
                        break
                    i = todo.popleft()
                    args = tuple(jobs[i][1]) if unpack else (*shared, jobs[i][1])
                    mine[self._dispatch(free[0], method, args)] = i
                busy = dict(self._busy)  # worker -> handle, stale calls of an abandoned iteration included
                for handle in self._ready(list(busy.values()), None):
                    worker = next(w for w, h in busy.items() if h is handle)
                    i = mine.pop(handle, None)
                    if i is None:  # a call an abandoned iteration left running
                        self._drop(worker, handle)
                        continue
                    try:
                        value = self._collect(worker, handle, labels[i], retry=True)
                    except WorkerDied as exc:
                        if tries[i] >= 1:
                            raise UnitError([f"{method} {labels[i]}"],
                                            f"its worker died twice (restarted once; {exc})") from None
                        tries[i] += 1
                        todo.appendleft(i)
                        continue
                    yield i, value
        finally:
            mine.clear()  # calls still running stay in _busy: their results are dropped when they arrive

    def close(self) -> None:
        self._stop()
        self._busy.clear()

    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Pending:
    """A call a worker serves (a process's or, here, one that ran: ``outcome`` is ``(ok, result or error)``)."""

    def __init__(self, worker: int, outcome: tuple[bool, Any] | None = None):
        self.worker, self.outcome = worker, outcome


# -- in this process -------------------------------------------------------------------------------------------
class InProcessActors(ActorPool):
    """Workers in this process: each call runs when it is sent."""

    name = "in-process"

    def __init__(self, factory: Callable[..., Any], args: Sequence[Any] = (), workers: int = 1,
                 max_pending: int | None = None):
        super().__init__(factory, args, workers, max_pending)
        self.state = [factory(*self.args) for _ in range(self.workers)]

    def _send(self, worker: int, method: str, args: tuple) -> Any:
        try:
            return _Pending(worker, (True, getattr(self.state[worker], method)(*args)))
        except Exception as exc:
            return _Pending(worker, (False, exc))

    def _ready(self, handles: list, timeout_s: float | None) -> list:
        return handles

    def _result(self, handle: Any) -> Any:
        ok, value = handle.outcome
        if ok:
            return value
        raise value

    def _restart(self, worker: int) -> None:
        self.state[worker] = self.factory(*self.args)


# -- local processes -------------------------------------------------------------------------------------------
def _serve(conn: Any, factory: Callable[..., Any], args: tuple) -> None:
    """A worker process: build the state, then answer ``(method, args)`` messages until ``None`` or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when calls stop
    state, failed = None, None
    try:
        state = factory(*args)
    except Exception as exc:  # every call then raises it
        failed = exc
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        method, call_args = msg
        try:
            if failed is not None:
                raise failed
            reply = (True, getattr(state, method)(*call_args))
        except Exception as exc:
            exc.add_note("in the worker process:\n" + "".join(traceback.format_exception(exc)))
            reply = (False, exc)
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send((False, RuntimeError(f"{method}: its result cannot be pickled: {exc}")))


class ProcessActors(ActorPool):
    """Workers in local ``spawn`` processes named ``{name}-{worker}``."""

    name = "processes"

    def __init__(self, factory: Callable[..., Any], args: Sequence[Any] = (), workers: int = 1,
                 max_pending: int | None = None, *, name: str = "lbbench-actor", stop_timeout_s: float = 5.0):
        super().__init__(factory, args, workers, max_pending)
        self.proc_name, self.stop_timeout_s = name, stop_timeout_s
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list[Any] = [None] * self.workers
        self.conns: list[Any] = [None] * self.workers
        for w in range(self.workers):
            self._spawn(w)

    def _spawn(self, worker: int) -> None:
        here, there = self.ctx.Pipe()
        proc = self.ctx.Process(target=_serve, args=(there, self.factory, self.args),
                                name=f"{self.proc_name}-{worker}", daemon=True)
        proc.start()
        there.close()
        self.procs[worker], self.conns[worker] = proc, here

    def _send(self, worker: int, method: str, args: tuple) -> Any:
        handle = _Pending(worker)
        try:
            self.conns[worker].send((method, args))
        except (BrokenPipeError, ConnectionResetError):  # it died while idle: _ready sees its sentinel
            pass
        return handle

    def _ready(self, handles: list, timeout_s: float | None) -> list:
        by_obj = {}
        for h in handles:
            by_obj[self.conns[h.worker]] = h
            by_obj[self.procs[h.worker].sentinel] = h
        ready = wait_ready(list(by_obj), timeout_s)
        return list({id(by_obj[r]): by_obj[r] for r in ready}.values())

    def _result(self, handle: Any) -> Any:
        conn, proc = self.conns[handle.worker], self.procs[handle.worker]
        try:
            if conn.poll():
                ok, value = conn.recv()
                if ok:
                    return value
                raise value
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        proc.join(1.0)
        raise WorkerDied(f"exit code {proc.exitcode}")

    def _restart(self, worker: int) -> None:
        self._end(worker, 0.0)
        self._spawn(worker)

    def _end(self, worker: int, timeout_s: float) -> None:
        proc = self.procs[worker]
        proc.join(timeout_s)
        if proc.is_alive():
            proc.terminate()
            proc.join(5.0)
        self.conns[worker].close()

    def _stop(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)  # read once the call it serves (if any) has returned
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + self.stop_timeout_s
        for w in range(self.workers):
            self._end(w, max(0.0, deadline - time.monotonic()))


# -- Ray actors ------------------------------------------------------------------------------------------------
class _Holder:
    """What a Ray actor is: the worker's state and a method-call entry point."""

    def __init__(self, factory: Callable[..., Any], args: tuple):
        self.state = factory(*args)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.state, method)(*args)


class RayActors(ActorPool):
    """Workers as Ray actors (``num_cpus`` each) on the cluster ``address`` names (``ray_cluster.connect``)."""

    name = "ray"

    def __init__(self, factory: Callable[..., Any], args: Sequence[Any] = (), workers: int = 1,
                 max_pending: int | None = None, *, address: str | None = "auto", num_cpus: float = 1,
                 **init_kwargs: Any):
        super().__init__(factory, args, workers, max_pending)
        self.ray = require_ray()
        self.joined = connect(address, **init_kwargs)
        self.remote = self.ray.remote(num_cpus=num_cpus, max_restarts=0)(_Holder)
        self.actors = [self.remote.remote(factory, self.args) for _ in range(self.workers)]

    def _send(self, worker: int, method: str, args: tuple) -> Any:
        return self.actors[worker].call.remote(method, *args)

    def _share(self, values: tuple) -> tuple:
        return tuple(self.ray.put(v) for v in values)

    def _ready(self, handles: list, timeout_s: float | None) -> list:
        if not handles:
            return []
        first, _ = self.ray.wait(handles, num_returns=1, timeout=timeout_s)
        if not first:
            return []
        return self.ray.wait(handles, num_returns=len(handles), timeout=0)[0]

    def _result(self, handle: Any) -> Any:
        try:
            return self.ray.get(handle)
        except self.ray.exceptions.RayTaskError as exc:  # the method raised: its own error, as it would be here
            raise exc.as_instanceof_cause() from None
        except self.ray.exceptions.RayActorError as exc:
            raise WorkerDied(type(exc).__name__) from None

    def _restart(self, worker: int) -> None:
        self.ray.kill(self.actors[worker], no_restart=True)
        self.actors[worker] = self.remote.remote(self.factory, self.args)

    def _stop(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors = []
        if self.joined:
            shutdown()


def get_actor_pool(factory: Callable[..., Any], args: Sequence[Any] = (), workers: int = 1,
                   ray_address: str | None = None, **kw: Any) -> ActorPool:
    """Ray actors when ``ray_address`` is given (``--ray``), else processes when ``workers > 1``, else here."""
    if ray_address is not None:
        return RayActors(factory, args, workers, address=ray_address, **kw)
    if workers > 1:
        return ProcessActors(factory, args, workers, **kw)
    return InProcessActors(factory, args, workers, **kw)
