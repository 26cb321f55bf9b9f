"""Scale-out: where units of work run (this process, a local process pool, a Ray cluster).

The stable API other modules use:

- ``get_executor(jobs, ray_address)`` -> an ``Executor`` (``SerialExecutor``, ``ProcessExecutor``,
  ``RayExecutor``) whose ``submit(units, fn)`` yields ``(index, result)`` as units finish;
- ``connect(address)`` / ``shutdown()``: join (or start) a Ray cluster for ``--ray``; ``require_ray()`` for
  code that needs the ``ray`` module itself;
- ``get_actor_pool(factory, args, workers, ray_address)`` -> an ``ActorPool`` (``InProcessActors``,
  ``ProcessActors``, ``RayActors``) of workers that keep state: ``submit(units, method, *shared)``,
  ``call(worker, method, *args)``, ``start(worker, method, *args) -> Call``;
- ``UnitError``: units (or calls) whose worker died twice.

Ray is optional (``pip install 'lbbench[ray]'``) and imported only when ``--ray`` is used.
"""

from .actors import ActorPool, Call, InProcessActors, ProcessActors, RayActors, WorkerDied, get_actor_pool
from .executors import (Executor, ProcessExecutor, RayExecutor, SerialExecutor, UnitError, auto_batch_size,
                        batches, get_executor, run_batch, unit_name)
from .ray_cluster import EXTRA_HINT, cluster_cpus, connect, node_address, require_ray, shutdown

__all__ = [
    "ActorPool", "Call", "InProcessActors", "ProcessActors", "RayActors", "WorkerDied", "get_actor_pool",
    "node_address",
    "EXTRA_HINT", "Executor", "ProcessExecutor", "RayExecutor", "SerialExecutor", "UnitError", "auto_batch_size",
    "batches", "cluster_cpus", "connect", "get_executor", "require_ray", "run_batch", "shutdown", "unit_name",
]
