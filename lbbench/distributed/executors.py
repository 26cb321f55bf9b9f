"""Where units of work run: in this process, in a local process pool (``--jobs N``) or on Ray (``--ray``).

One interface, ``Executor.submit(units, fn)``: it runs ``fn(unit)`` for every unit and yields
``(index, result)`` pairs as results come back — in completion order, so the caller (the one run-directory
writer) puts them in unit order itself. ``fn`` must be a module-level function (it is pickled to the workers),
and it must be deterministic for its unit: where a unit runs never changes its result.

- ``SerialExecutor``: one unit after the other, here.
- ``ProcessExecutor(jobs)``: a ``spawn`` process pool (a forked child can deadlock on locks held by polars'
  threads). A pool whose worker died is rebuilt once and the unfinished units resubmitted; a second death
  raises ``UnitError``.
- ``RayExecutor(address)``: Ray tasks. Consecutive units are batched into one task (Ray's guidance against
  tiny tasks: a simulated unit takes a fraction of a second, a task should take more); at most
  ``max_pending`` tasks are in flight (``ray.wait``); a task whose worker process dies is retried once by Ray
  (``max_retries=1``), then ``UnitError`` names its units. Each task says which node ran it: ``describe()``
  gives ``run.toml`` the units per node (``ray_nodes``) and each unit's node (``unit_nodes``; a retried unit
  the node its retry ran on). A node is named by its ``lbbench-node:NAME`` resource (``ray_cluster``'s local
  nodes), else by its address, with the start of its node id when several nodes share one.

Leaving the iteration early (Ctrl-C, an error, ``close()`` on the generator) cancels what is still pending;
results already yielded stay with the caller. Executors are context managers: ``close()`` disconnects from a
Ray cluster that ``connect`` joined for them.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Sequence, TypeVar

from .ray_cluster import cluster_cpus, connect, node_names, require_ray, shutdown

T = TypeVar("T")
R = TypeVar("R")


class UnitError(RuntimeError):
    """Units that could not run: their worker died (again after the retry). ``labels`` names them."""

    def __init__(self, labels: Sequence[str], problem: str):
        self.labels = list(labels)
        self.problem = problem
        shown = ", ".join(self.labels[:4]) + (f" and {len(self.labels) - 4} more" if len(self.labels) > 4 else "")
        super().__init__(f"unit{'s' if len(self.labels) > 1 else ''} {shown}: {problem}")


def unit_name(unit: Any) -> str:
    """A unit's name in messages: its ``label`` attribute when it has one."""
    return str(getattr(unit, "label", None) or unit)


def run_batch(fn: Callable[[T], R], units: Sequence[T]) -> list[R]:
    """What one task or pool job runs: ``fn`` on each unit of a batch, in order."""
    return [fn(u) for u in units]


def run_batch_on_node(fn: Callable[[T], R], units: Sequence[T]) -> tuple[str, list[R]]:
    """What one Ray task runs: ``run_batch``, and the id of the node it ran on."""
    return require_ray().get_runtime_context().get_node_id(), run_batch(fn, units)


def batches(num_units: int, batch_size: int) -> list[range]:
    """Consecutive index ranges of at most ``batch_size`` covering ``range(num_units)``."""
    size = max(1, batch_size)
    return [range(i, min(i + size, num_units)) for i in range(0, num_units, size)]


def auto_batch_size(num_units: int, num_cpus: int, tasks_per_cpu: int = 4) -> int:
    """Units per task: about ``tasks_per_cpu`` tasks per CPU, so every task holds several units (a task well
    over Ray's per-task overhead) while the last wave still spreads over the CPUs."""
    return max(1, math.ceil(num_units / max(1, num_cpus * tasks_per_cpu)))


class Executor:
    """Runs ``fn`` on units; see the module docstring."""

    name = "executor"

    def submit(self, units: Sequence[T], fn: Callable[[T], R]) -> Iterator[tuple[int, R]]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What ``run.toml`` records about where the units ran."""
        return {"executor": self.name}

    def close(self) -> None:
        pass

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SerialExecutor(Executor):
    name = "serial"

    def submit(self, units: Sequence[T], fn: Callable[[T], R]) -> Iterator[tuple[int, R]]:
        for i, u in enumerate(units):
            yield i, fn(u)


class ProcessExecutor(Executor):
    """A local ``spawn`` process pool of ``jobs`` processes."""

    name = "processes"

    def __init__(self, jobs: int, batch_size: int | None = None):
        self.jobs = max(1, jobs)
        self.batch_size = batch_size

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name, "jobs": self.jobs}

    def submit(self, units: Sequence[T], fn: Callable[[T], R]) -> Iterator[tuple[int, R]]:
        import multiprocessing  # lazy: start-up time (the process pool's machinery, for --jobs N only)
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait  # lazy: start-up time (as above)
        from concurrent.futures.process import BrokenProcessPool  # lazy: start-up time (as above)

        units = list(units)
        todo = batches(len(units), self.batch_size or auto_batch_size(len(units), self.jobs, tasks_per_cpu=8))
        todo.reverse()  # pop() from the end takes them in order
        ctx = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(min(self.jobs, max(1, len(units))), mp_context=ctx)
        pending: dict[Any, range] = {}
        restarts = 0
        try:
            while todo or pending:
                while todo and len(pending) < 2 * self.jobs:
                    idx = todo.pop()
                    pending[pool.submit(run_batch, fn, [units[i] for i in idx])] = idx
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                broken: list[range] = []
                for fut in done:
                    idx = pending.pop(fut)
                    try:
                        results = fut.result()
                    except BrokenProcessPool:
                        broken.append(idx)
                        continue
                    yield from zip(idx, results)
                if broken:
                    lost = sorted(broken + list(pending.values()), key=lambda r: r.start)
                    pending.clear()
                    pool.shutdown(wait=False, cancel_futures=True)
                    if restarts >= 1:
                        raise UnitError([unit_name(units[i]) for r in lost for i in r],
                                        "a worker process died twice (the pool was rebuilt once)")
                    restarts += 1
                    todo.extend(reversed(lost))
                    pool = ProcessPoolExecutor(min(self.jobs, max(1, len(units))), mp_context=ctx)
        finally:
            for fut in pending:
                fut.cancel()
            pool.shutdown(wait=False, cancel_futures=True)


class RayExecutor(Executor):
    """Ray tasks on the cluster ``address`` names (``lbbench.distributed.ray_cluster.connect``)."""

    name = "ray"

    def __init__(self, address: str | None = "auto", batch_size: int | None = None,
                 max_pending: int | None = None, **init_kwargs: Any):
        connect(address, **init_kwargs)
        self.address = address
        self.batch_size = batch_size
        self.num_cpus = cluster_cpus()
        self.max_pending = max_pending or 2 * self.num_cpus
        #: the node (its id) each unit ran on, by unit label, in unit order once ``submit`` is done
        self.unit_node_ids: dict[str, str] = {}
        self._node_names: dict[str, str] = {}

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"executor": self.name, "ray_address": self.address or "auto",
                               "ray_cpus": self.num_cpus}
        if self.unit_node_ids:
            nodes = self.unit_nodes()
            counts: dict[str, int] = {}
            for name in nodes.values():
                counts[name] = counts.get(name, 0) + 1
            out["ray_nodes"] = [{"node": n, "units": c} for n, c in sorted(counts.items())]
            out["unit_nodes"] = nodes
        return out

    def unit_nodes(self) -> dict[str, str]:
        """The node each unit ran on (its name; see the module docstring), by unit label."""
        return {label: self._node_names.get(nid, nid) for label, nid in self.unit_node_ids.items()}

    def _name_nodes(self) -> None:
        """Names of the cluster's nodes (alive or dead), by node id."""
        self._node_names.update(node_names())

    def close(self) -> None:
        shutdown()

    def submit(self, units: Sequence[T], fn: Callable[[T], R]) -> Iterator[tuple[int, R]]:
        ray = require_ray()
        RayError, RayTaskError, TaskCancelledError = (ray.exceptions.RayError, ray.exceptions.RayTaskError,
                                                      ray.exceptions.TaskCancelledError)
        task = ray.remote(max_retries=1, retry_exceptions=False)(run_batch_on_node)
        units = list(units)
        todo = batches(len(units), self.batch_size or auto_batch_size(len(units), self.num_cpus))
        todo.reverse()
        fn_ref = ray.put(fn)
        pending: dict[Any, range] = {}
        try:
            while todo or pending:
                while todo and len(pending) < self.max_pending:
                    idx = todo.pop()
                    pending[task.remote(fn_ref, [units[i] for i in idx])] = idx
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    idx = pending.pop(ref)
                    try:
                        node_id, results = ray.get(ref)
                    except RayTaskError as exc:  # fn raised: the unit's own error, as it would be run here
                        raise exc.as_instanceof_cause() from None
                    except (RayError, TaskCancelledError) as exc:  # the worker died, twice
                        raise UnitError([unit_name(units[i]) for i in idx],
                                        f"its Ray worker died and the retry failed too "
                                        f"({type(exc).__name__})") from exc
                    if node_id not in self._node_names:
                        self._name_nodes()
                    for i in idx:
                        self.unit_node_ids[unit_name(units[i])] = node_id
                    yield from zip(idx, results)
        finally:
            for ref in pending:
                ray.cancel(ref)
            names = [unit_name(u) for u in units]  # this submit's units in unit order, after any earlier ones
            mine = set(names)
            self.unit_node_ids = {**{k: v for k, v in self.unit_node_ids.items() if k not in mine},
                                  **{k: self.unit_node_ids[k] for k in names if k in self.unit_node_ids}}


def get_executor(jobs: int = 1, ray_address: str | None = None, *, batch_size: int | None = None
                 ) -> Executor:
    """The executor flags ask for: Ray when ``ray_address`` is given (``--ray``; ``"auto"`` for the flag
    alone), else a process pool when ``jobs > 1`` (``--jobs``), else this process."""
    if ray_address is not None:
        return RayExecutor(ray_address, batch_size=batch_size)
    if jobs > 1:
        return ProcessExecutor(jobs, batch_size=batch_size)
    return SerialExecutor()
