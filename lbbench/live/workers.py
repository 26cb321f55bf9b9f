"""Stream handling in worker processes: the dispatcher keeps time, the workers read the streams.

One event loop that both keeps the arrival schedule and reads every streamed chunk falls behind when an engine
step answers hundreds of streams at once: each chunk costs tens of microseconds in the HTTP stack, so a burst of
250 chunks holds the next send for several milliseconds. With ``stream_workers=N`` the replay's dispatcher
(schedule, decision epochs, cluster state, records) stays in its process and hands each dispatched request to one
of ``N`` worker processes, which send it, read its stream and return, batched once per loop iteration:

- ``("first", request_id, instance, t)`` and ``("tokens", request_id, instance, t, count)``: the same throttled
  token events ``Drive.token_observer`` makes (first token, then at most one per ``min_step_s``);
- ``("done", request_id, instance, StreamResult)``: the whole result, token times included.

Every time is ``time.monotonic()`` minus the run's zero, which the dispatcher sends to each worker, so times
from all processes share one clock. ``actual_send_s`` is still taken when the HTTP request starts, in the worker:
the dispatch lag a record shows includes the hand-over.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..core import Request
from ..engines import get_engine
from .drive import new_event_loop
from .http import HttpBackend, TokenCallback, throttled


def token_events(rid: int, inst: int, min_step_s: float, emit: Callable[[tuple], None]) -> TokenCallback:
    """A stream's token callback that emits ``("first", ...)`` once, then ``("tokens", ...)`` at most once per
    ``min_step_s`` (``lbbench.live.http.throttled``, as ``Drive.token_observer``), for a worker that reports to
    its driver."""
    return throttled(min_step_s, lambda t: emit(("first", rid, inst, t)),
                     lambda t, count: emit(("tokens", rid, inst, t, count)))


async def send_and_report(backend: HttpBackend, url: str, req: Request, inst: int, raw: bytes, min_step_s: float,
                          emit: Callable[[tuple], None]) -> None:
    """Send one request (``raw``: its bytes from ``backend.prepare``) and report it as a worker does: token
    events while it streams, then ``("done", request_id, instance, StreamResult)``. Stream workers and load
    workers both send through this."""
    rid = req.request_id
    res = await backend.send(url, req, token_events(rid, inst, min_step_s, emit), raw)
    emit(("done", rid, inst, res))


@dataclass(frozen=True)
class WorkerSettings:
    endpoints: tuple[str, ...]
    model: str
    api: str
    engine: str
    request_timeout_s: float
    min_step_s: float
    warm_connections: int


class BatchedEmit:
    """What a worker emits in one turn of its event loop goes out as one batch, on the next turn: ``_emit``
    queues an item, ``_send_batch`` (the subclass's) sends the batch. The subclass sets ``outbox = []``,
    ``_flush_pending = False`` and ``loop``."""

    outbox: list[tuple]
    _flush_pending: bool
    loop: asyncio.AbstractEventLoop

    def _emit(self, item: tuple) -> None:
        self.outbox.append(item)
        if not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        batch, self.outbox = self.outbox, []
        self._send_batch(batch)

    def _send_batch(self, batch: list[tuple]) -> None:
        raise NotImplementedError


class _Worker(BatchedEmit):
    def __init__(self, conn: Any, settings: WorkerSettings):
        self.conn = conn
        self.s = settings
        self.t0 = time.monotonic()
        self.outbox: list[tuple] = []
        self.tasks: set[asyncio.Task] = set()
        self._flush_pending = False

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()
        async with HttpBackend(model=self.s.model, clock=self.now, api=self.s.api, engine=get_engine(self.s.engine),
                               request_timeout_s=self.s.request_timeout_s) as backend:
            self.backend = backend
            await backend.warm(self.s.endpoints, self.s.warm_connections)
            self.conn.send([("ready",)])
            self.loop.add_reader(self.conn.fileno(), self._readable)
            await self.stopped.wait()
            self.loop.remove_reader(self.conn.fileno())
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def _readable(self) -> None:
        try:
            while self.conn.poll():
                msg = self.conn.recv()
                kind = msg[0]
                if kind == "send":
                    _, req, inst, prio, text = msg
                    task = self.loop.create_task(self._one(req, inst, prio, text))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                elif kind == "t0":
                    self.t0 = msg[1]
                elif kind == "stop":
                    self.stopped.set()
                    return
        except (EOFError, OSError):  # the dispatcher went away
            self.stopped.set()

    def _send_batch(self, batch: list[tuple]) -> None:
        try:
            self.conn.send(batch)
        except (BrokenPipeError, OSError):
            self.stopped.set()

    async def _one(self, req: Request, inst: int, prio: int | None, text: str | None) -> None:
        url = self.s.endpoints[inst]
        raw = self.backend.prepare(url, req, prio, text)
        await send_and_report(self.backend, url, req, inst, raw, self.s.min_step_s, self._emit)


def worker_main(conn: Any, settings: WorkerSettings) -> None:
    """A stream worker's process: serve jobs from ``conn`` until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the dispatcher decides when a run stops
    loop = new_event_loop()
    try:
        loop.run_until_complete(_Worker(conn, settings).run())
    finally:
        loop.close()
        conn.close()


class StreamWorkers:
    """The dispatcher's side: ``n`` spawned worker processes and their pipes."""

    def __init__(self, n: int, settings: WorkerSettings, start_timeout_s: float = 60.0):
        ctx = multiprocessing.get_context("spawn")  # a forked child would inherit the parent's event loop
        self.conns = []
        self.procs = []
        self.load = [0] * n
        self.worker_of: dict[int, int] = {}
        for i in range(n):
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=worker_main, args=(child, settings), name=f"lbbench-stream-{i}", daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        for i, conn in enumerate(self.conns):
            if not conn.poll(start_timeout_s) or conn.recv() != [("ready",)]:
                self.close()
                raise RuntimeError(f"stream worker {i} did not start within {start_timeout_s:g}s")

    def start(self, loop: asyncio.AbstractEventLoop, t0: float, on_item: Callable[[tuple], None],
              on_error: Callable[[BaseException], None]) -> None:
        """Send the run's clock zero and start reading the workers' batches on ``loop``."""
        self.loop = loop
        self.on_item = on_item
        self.on_error = on_error
        for i, conn in enumerate(self.conns):
            conn.send(("t0", t0))
            loop.add_reader(conn.fileno(), self._readable, i)

    def submit(self, req: Request, inst: int, priority: int | None, prompt_text: str | None) -> None:
        """Hand a dispatched request to the least-loaded worker."""
        i = min(range(len(self.conns)), key=self.load.__getitem__)
        self.load[i] += 1
        self.worker_of[req.request_id] = i
        self.conns[i].send(("send", req, inst, priority, prompt_text))

    def _readable(self, i: int) -> None:
        conn = self.conns[i]
        try:
            while conn.poll():
                for item in conn.recv():
                    if item[0] == "done":
                        w = self.worker_of.pop(item[1], None)
                        if w is not None:
                            self.load[w] -= 1
                    self.on_item(item)
        except (EOFError, OSError) as exc:
            self.loop.remove_reader(conn.fileno())
            self.on_error(RuntimeError(f"stream worker {i} exited ({type(exc).__name__})"))

    def close(self) -> None:
        for conn in self.conns:
            try:
                if getattr(self, "loop", None) is not None:
                    self.loop.remove_reader(conn.fileno())
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for conn in self.conns:
            conn.close()
