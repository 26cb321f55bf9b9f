"""Where CPU vLLM instances and the benchmark client run: cores that no two of them share.

A GPU instance does not share its compute with another instance or with the client that drives it. CPU instances
on one machine do unless they are placed: two engines on two cores slow each other's steps with each other's load,
and a profile calibrated under that contention carries it into workloads of another shape (docs/fidelity.md).

``plan_placement(cores, instances, cpus_per_instance)`` gives instance ``i`` the ``i``-th block of
``cpus_per_instance`` cores and the client every core left; it refuses, with :class:`PlacementError`, a layout the
machine cannot hold (each instance needs its cores and the client at least one). The launcher binds each server
process to its block (``sched_setaffinity`` before the server starts, so every thread and child inherits it, plus
``VLLM_CPU_OMP_THREADS_BIND`` for vLLM's OpenMP threads), and :func:`pin_client` binds the client's process (all of
its threads; worker processes it starts later inherit it) to the rest.

``front_end`` says where each instance's API server process (HTTP, tokenizer, detokenizer, streaming) runs. On a
GPU host it runs on host cores while the model runs on the GPU, so its per-token and per-request work does not
lengthen the model's steps. ``"client"`` (the launcher's default) reproduces that on CPUs: once the server is
healthy, the launcher moves the API server's threads to the client's cores and leaves the instance's cores to the
engine core (and its model workers). ``"instance"`` keeps it beside the engine core, as before: measured on one
pinned tiny-model instance, the sweep then charged 249 us of decode per sequence against 168-231 us, and the API
server's share of the engine's core differs from workload to workload (docs/fidelity.md, "The second: where the API
server runs").
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator, Sequence

from ...errors import InputError


class PlacementError(InputError):
    """A layout the machine cannot hold (the message names ``cpus_per_instance`` and the cores)."""


@dataclass(frozen=True)
class Placement:
    """Cores of each instance and of the client; ``pinned`` False means instances share the machine's cores."""

    instance_cores: tuple[tuple[int, ...], ...]
    client_cores: tuple[int, ...]
    pinned: bool
    #: where each instance's API server (HTTP, tokenizer, detokenizer) runs when pinned: ``"instance"``, on the
    #: instance's cores beside its engine core; ``"client"``, on the client's cores (:data:`FRONT_END_PLACES`)
    front_end: str = "instance"

    def as_dict(self) -> dict:
        """The run.toml form: ``{"pinned": ..., "instance_cores": ["0", ...], "client_cores": "1",
        "front_end": "instance"}``."""
        return {"pinned": self.pinned, "instance_cores": [cores_label(c) for c in self.instance_cores],
                "client_cores": cores_label(self.client_cores), "front_end": self.front_end}

    def front_end_cores(self, i: int) -> tuple[int, ...]:
        """The cores instance ``i``'s API server runs on."""
        return self.client_cores if self.front_end == "client" else self.instance_cores[i]


def cores_label(cores: Sequence[int]) -> str:
    """``"0-3"`` for a contiguous run, ``"0,2"`` otherwise, ``"4"`` for one core (``VLLM_CPU_OMP_THREADS_BIND``'s
    syntax)."""
    cores = sorted(cores)
    if not cores:
        return ""
    if len(cores) == 1:
        return str(cores[0])
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def available_cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


#: where a pinned instance's API server may run (``Placement.front_end``)
FRONT_END_PLACES = ("instance", "client")


def plan_placement(cores: Sequence[int], instances: int, cpus_per_instance: int,
                   front_end: str = "client") -> Placement:
    """Instance ``i`` on cores ``[i*N, (i+1)*N)`` of ``cores`` (sorted), the client on the rest; ``front_end``
    ``"client"`` moves each instance's API server onto the client's cores, leaving its engine core (and model
    workers) alone on the instance's."""
    cores = sorted(cores)
    if front_end not in FRONT_END_PLACES:
        raise PlacementError(f"front_end: {front_end!r} must be one of {', '.join(FRONT_END_PLACES)}")
    if cpus_per_instance < 1:
        raise PlacementError(f"cpus_per_instance: {cpus_per_instance} must be >= 1")
    if instances < 1:
        raise PlacementError(f"instances: {instances} must be >= 1")
    need = instances * cpus_per_instance + 1
    if need > len(cores):
        raise PlacementError(
            f"cpus_per_instance: {instances} instance(s) x {cpus_per_instance} core(s) + 1 core for the client "
            f"need {need} cores; this process may use {len(cores)} ({cores_label(cores)})")
    blocks = tuple(tuple(cores[i * cpus_per_instance:(i + 1) * cpus_per_instance]) for i in range(instances))
    return Placement(blocks, tuple(cores[instances * cpus_per_instance:]), pinned=True, front_end=front_end)


def shared_placement(groups: Sequence[str], cores: Sequence[int]) -> Placement:
    """Today's layout without ``cpus_per_instance``: the machine's cores split between the instances (the
    ``groups`` of :func:`~lbbench.engines.vllm.launcher.split_cores`), the client anywhere."""
    def parse(group: str) -> tuple[int, ...]:
        out: list[int] = []
        for part in group.split(","):
            a, _, b = part.partition("-")
            out += list(range(int(a), int(b or a) + 1))
        return tuple(out)
    return Placement(tuple(parse(g) for g in groups), tuple(sorted(cores)), pinned=False)


@contextlib.contextmanager
def pin_client(cores: Sequence[int] | None) -> Iterator[None]:
    """Run the body with this process bound to ``cores`` (None: unchanged); the previous affinity is restored."""
    if not cores:
        yield
        return
    before = sorted(os.sched_getaffinity(0))
    bind_process(os.getpid(), cores)  # sched_setaffinity(0) alone would bind the calling thread only
    try:
        yield
    finally:
        bind_process(os.getpid(), before)


def bind_process(pid: int, cores: Sequence[int]) -> int:
    """Bind every thread of process ``pid`` to ``cores`` (threads it starts later inherit it from theirs; its
    child processes keep their own binding); returns how many threads were bound (0 when it is gone)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    done = 0
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cores)
            done += 1
    return done


def bind_current_process(cores: Sequence[int]) -> None:
    """Bind the calling process to ``cores`` (used in a server's ``preexec_fn``, before it runs anything)."""
    os.sched_setaffinity(0, cores)
