"""Load workers: processes (or Ray actors) that send requests at planned times and read their streams.

The replay's driver keeps the one schedule, the router, the cluster state and the records, as AIPerf's timing
manager and inference-perf's main process do. It decides each request a little ahead of its arrival (the
replay's send lead) and hands ``(request, instance, planned_send_s)`` to one worker; the worker sends it when its
own clock says ``planned_send_s`` has come, sends it and reads its stream with the run's one sender
(``lbbench.live.http.HttpBackend``, through ``lbbench.live.workers.send_and_report``) and returns, batched once
per loop iteration, the same items as stream workers (``lbbench.live.workers``):

- ``("first", request_id, instance, t)`` and ``("tokens", request_id, instance, t, count)``: throttled token
  events (first token, then at most one per ``min_step_s``);
- ``("done", request_id, instance, StreamResult)``: the whole result.

**One clock.** Workers connect to the driver over TCP (the same on one machine and across a Ray cluster). Before
the run each one measures its clock offset to the driver by ping-pong (``lbbench.live.clock``: the round with the
minimum round trip), and from then on reads the driver's run clock as ``time.monotonic() - offset - t0``: planned
times are met on the driver's clock, and every time a worker returns (send, tokens, finish) is on it, so the
dispatch lag ``actual_send_s - planned_send_s`` is measured on the driver's clock.

Messages are length-prefixed pickles. A worker that dies (its connection closes) is reported to the driver's
``on_lost``; the replay then stops, keeps what finished and marks itself incomplete.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import os
import pickle
import signal
import socket
import struct
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from ..core import Request
from ..distributed.actors import ActorPool, Call, ProcessActors, RayActors
from ..distributed.executors import UnitError
from ..distributed.ray_cluster import current_node_id, node_address, node_names
from ..engines import get_engine
from .clock import ClockOffset, ClockSync, measure_offset
from .drive import new_event_loop, quiet_gc
from .http import HttpBackend
from .memtrace import MemTrace
from .workers import BatchedEmit, WorkerSettings, send_and_report

_LEN = struct.Struct("!I")
#: the worker's scheduler wakes this much before a planned send and yields to other callbacks until it is due
#: (the event loop's timers are millisecond-precise; each wait costs this much CPU per request)
EARLY_WAKE_S = 0.0002


@dataclass(frozen=True)
class LoadWorkerSettings(WorkerSettings):
    """A stream worker's settings, plus the ping-pong rounds of the clock-offset measurement, and how often
    (worker clock, seconds; 0: never) and in how many rounds the offset is measured again during the run."""
    ping_rounds: int = 16
    resync_every_s: float = 60.0
    resync_rounds: int = 8


@dataclass(frozen=True)
class WorkerInfo:
    """Who a worker is and how its clock relates to the driver's (``node``: a Ray actor's node, named as a Ray
    sweep's ``unit_nodes`` name them)."""

    worker: int
    host: str
    pid: int
    clock: ClockOffset
    node: str | None = None


# -- framing ---------------------------------------------------------------------------------------------------
def send_msg(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_msg(sock: socket.socket) -> Any:
    """One message from a blocking socket (``EOFError`` when it closed)."""
    head = _recv_exact(sock, _LEN.size)
    return pickle.loads(_recv_exact(sock, _LEN.unpack(head)[0]))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise EOFError("connection closed")
        out += got
    return bytes(out)


class Outbox:
    """Framed writes that never block the event loop: what the kernel does not take at once waits for the loop's
    writer callback (a blocking send would stall the loop, and two peers blocked on each other would deadlock)."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, on_error: Callable[[], None]):
        self.sock, self.loop, self.on_error = sock, loop, on_error
        self.buf = bytearray()

    def write(self, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        data = _LEN.pack(len(data)) + data
        if self.buf:
            self.buf += data
            return
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self.on_error()
            return
        if n < len(data):
            self.buf += data[n:]
            self.loop.add_writer(self.sock.fileno(), self._writable)

    def _writable(self) -> None:
        try:
            n = self.sock.send(self.buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.loop.remove_writer(self.sock.fileno())
            self.on_error()
            return
        del self.buf[:n]
        if not self.buf:
            self.loop.remove_writer(self.sock.fileno())

    def drain_blocking(self, timeout_s: float = 2.0) -> None:
        """Send what is still buffered, blocking (at the end of a run, before a last message)."""
        if self.buf:
            self.loop.remove_writer(self.sock.fileno())
            self.sock.settimeout(timeout_s)
            self.sock.sendall(bytes(self.buf))
            self.buf.clear()


class Frames:
    """Reassembles messages from a byte stream read in arbitrary pieces."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> list[Any]:
        buf = self.buf + data if self.buf else data
        out, pos = [], 0
        while len(buf) - pos >= _LEN.size:
            (n,) = _LEN.unpack_from(buf, pos)
            if len(buf) - pos - _LEN.size < n:
                break
            out.append(pickle.loads(buf[pos + _LEN.size:pos + _LEN.size + n]))
            pos += _LEN.size + n
        self.buf = buf[pos:]
        return out


# -- the worker ------------------------------------------------------------------------------------------------
class _Worker(BatchedEmit):
    def __init__(self, sock: socket.socket, clock: ClockOffset, settings: LoadWorkerSettings, index: int = 0):
        self.sock = sock
        self.index = index
        self.offset_s = clock.offset_s
        self.sync = ClockSync(time.monotonic, clock, settings.resync_every_s, settings.resync_rounds)
        self.t0 = math.inf  # the driver's run-clock zero (driver's monotonic), sent before any job
        self.s = settings
        self.heap: list[tuple[float, int, tuple]] = []
        self.seq = itertools.count()
        self.outbox: list[tuple] = []
        self.tasks: set[asyncio.Task] = set()
        self.frames = Frames()
        self._flush_pending = False
        self._timer: asyncio.Handle | None = None
        self._timer_at = math.inf

    def now(self) -> float:
        """The driver's run clock, read on this worker."""
        return time.monotonic() - self.offset_s - self.t0

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stopped = asyncio.Event()
        self.mem = MemTrace(f"load-worker-{self.index}")  # LBBENCH_TRACEMALLOC: where a long run's memory goes
        self.mem.start()
        if self.mem.on:
            def tick() -> None:
                self.mem.tick()
                self.loop.call_later(1.0, tick)
            tick()
        self.client = HttpBackend(model=self.s.model, clock=self.now, api=self.s.api,
                                  engine=get_engine(self.s.engine), request_timeout_s=self.s.request_timeout_s)
        try:
            await self.client.warm(self.s.endpoints, self.s.warm_connections)
            send_msg(self.sock, [("ready",)])
            self.sock.setblocking(False)
            self.out = Outbox(self.sock, self.loop, self.stopped.set)
            self.loop.add_reader(self.sock.fileno(), self._readable)
            if self.s.resync_every_s > 0:
                self._resync_check()
            await self.stopped.wait()
            self.loop.remove_reader(self.sock.fileno())
            if self._timer is not None:
                self._timer.cancel()
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
        finally:
            self.client.close()
            self.mem.dump()

    def _readable(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the driver went away
            self.stopped.set()
            return
        for msg in self.frames.feed(data):
            for item in msg:
                kind = item[0]
                if kind == "send":
                    _, req, inst, prio, text, planned_s = item
                    # the request's bytes are built now, ahead of its send time: at that time they are only written
                    raw = self.client.prepare(self.s.endpoints[inst], req, prio, text)
                    heapq.heappush(self.heap, (planned_s, next(self.seq), (req, inst, raw)))
                elif kind == "pong":
                    self._pong(item[1], item[2])
                elif kind == "t0":
                    self.t0 = item[1]
                elif kind == "stop":
                    self.stopped.set()
                    return
        self._arm()

    # -- clock re-synchronisation ------------------------------------------------------------------------------
    def _resync_check(self) -> None:
        if self.sync.due():
            self.out.write([("ping", self.index, self.sync.ping())])
        self.loop.call_later(min(1.0, self.s.resync_every_s / 4), self._resync_check)

    def _pong(self, t0: float, t_driver: float) -> None:
        off = self.sync.pong(t0, t_driver)
        if off is None:
            self.out.write([("ping", self.index, self.sync.ping())])
            return
        self.offset_s = off.offset_s  # from now on planned sends and reported times follow the driver's clock
        self.out.write([("clock", self.index, off.offset_s, off.rtt_s)])

    # -- the schedule ------------------------------------------------------------------------------------------
    def _arm(self) -> None:
        """Make sure a wake-up is set for the earliest planned send."""
        if not self.heap:
            return
        due = self.heap[0][0]
        if due >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = due
        delay = due - self.now() - EARLY_WAKE_S
        self._timer = self.loop.call_later(delay, self._due) if delay > 0 else self.loop.call_soon(self._due)

    def _due(self) -> None:
        self._timer, self._timer_at = None, math.inf
        heap, now = self.heap, self.now()
        while heap and heap[0][0] <= now:
            _, _, (req, inst, raw) = heapq.heappop(heap)
            task = self.loop.create_task(self._one(req, inst, raw))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            now = self.now()
        if heap:
            if heap[0][0] - now <= EARLY_WAKE_S:  # the last fraction: yield to other callbacks until it is due
                self._timer_at = heap[0][0]
                self._timer = self.loop.call_soon(self._due)
            else:
                self._arm()

    # -- sending -----------------------------------------------------------------------------------------------
    def _send_batch(self, batch: list[tuple]) -> None:
        self.out.write(batch)

    async def _one(self, req: Request, inst: int, raw: bytes) -> None:
        await send_and_report(self.client, self.s.endpoints[inst], req, inst, raw, self.s.min_step_s, self._emit)


def worker_main(worker: int, address: tuple[str, int], settings: LoadWorkerSettings) -> None:
    """A load worker: connect to the driver, measure the clock offset, then serve jobs until told to stop."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when a run stops
    except ValueError:  # not the main thread (a Ray actor's executor thread)
        pass

    sock = socket.create_connection(address, timeout=60)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        send_msg(sock, ("hello", worker, socket.gethostname(), os.getpid(), current_node_id()))

        def ask_driver() -> float:
            send_msg(sock, ("ping",))
            return recv_msg(sock)[1]

        clock = measure_offset(time.monotonic, ask_driver, settings.ping_rounds)
        send_msg(sock, ("clock", clock.offset_s, clock.rtt_s))
        loop = new_event_loop()
        try:
            with quiet_gc():  # as the driver's: no full collection over the streams in flight stops the loop
                loop.run_until_complete(_Worker(sock, clock, settings, worker).run())
        finally:
            loop.close()
    except (EOFError, OSError):  # the driver went away
        pass
    finally:
        sock.close()


class LoadWorkerActor:
    """A load worker in an actor pool (``lbbench.distributed``): ``run`` serves one replay (``worker_main``)."""

    def run(self, worker: int, address: tuple[str, int], settings: LoadWorkerSettings) -> None:
        worker_main(worker, address, settings)


# -- the driver's side -----------------------------------------------------------------------------------------
class LoadWorkers:
    """``n`` load workers connected to this driver: local processes, or Ray actors when ``ray`` is set."""

    def __init__(self, n: int, settings: LoadWorkerSettings, ray: bool = False, start_timeout_s: float = 120.0):
        self.n = n
        self.pool: ActorPool | None = None
        self.calls: list[Call] = []
        self.socks: list[socket.socket] = []
        self.info: list[WorkerInfo] = []
        #: per worker: (driver monotonic, offset) for the offset measured before the run and each re-measurement
        self.clock_history: list[list[tuple[float, ClockOffset]]] = [[] for _ in range(n)]
        self.load = [0] * n
        self.worker_of: dict[int, int] = {}
        self.outbox: list[list[tuple]] = [[] for _ in range(n)]
        self.alive = [True] * n
        self._flush_pending = False
        self.loop: asyncio.AbstractEventLoop | None = None
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0" if ray else "127.0.0.1", 0))
        listener.listen(n)
        listener.settimeout(start_timeout_s)
        try:
            host = "127.0.0.1"
            if ray:
                host = node_address()
            address = (host, listener.getsockname()[1])
            self._start(n, address, settings, ray)
            by_id: dict[int, socket.socket] = {}
            deadline = time.monotonic() + start_timeout_s
            listener.settimeout(0.25)
            while len(by_id) < n:
                try:
                    sock, _ = listener.accept()
                except socket.timeout:
                    self._check_started()
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{n - len(by_id)} load worker(s) did not connect within "
                                           f"{start_timeout_s:g}s") from None
                    continue
                sock.settimeout(start_timeout_s)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello = recv_msg(sock)
                by_id[hello[1]] = sock
                self.info.append(WorkerInfo(hello[1], hello[2], hello[3], ClockOffset(0.0, math.inf), hello[4]))
            self.socks = [by_id[i] for i in range(n)]
            self.info.sort(key=lambda w: w.worker)
            if ray:  # node ids -> the names run.toml gives a Ray sweep's nodes
                names = node_names()
                self.info = [replace(w, node=names.get(w.node, w.node)) for w in self.info]
            for i, sock in enumerate(self.socks):  # serve one worker's pings at a time: its round trips stay short
                while True:
                    msg = recv_msg(sock)
                    if msg[0] == "ping":
                        send_msg(sock, ("pong", time.monotonic()))
                    elif msg[0] == "clock":
                        self._set_clock(i, ClockOffset(msg[1], msg[2]))
                        break
            for i, sock in enumerate(self.socks):
                if recv_msg(sock) != [("ready",)]:
                    raise RuntimeError(f"load worker {i} did not get ready")
                sock.settimeout(None)
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()

    def _start(self, n: int, address: tuple[str, int], settings: LoadWorkerSettings, ray: bool) -> None:
        # spawned processes (a forked child would inherit the parent's event loop) named lbbench-load-{i}, or
        # Ray actors on the cluster the caller connected to
        self.pool = (RayActors(LoadWorkerActor, (), n) if ray else
                     ProcessActors(LoadWorkerActor, (), n, name="lbbench-load"))
        self.calls = [self.pool.start(i, "run", i, address, settings) for i in range(n)]

    def _set_clock(self, i: int, clock: ClockOffset) -> None:
        """Worker ``i`` measured its clock offset (before the run, or again during it)."""
        self.info[i] = replace(self.info[i], clock=clock)
        self.clock_history[i].append((time.monotonic(), clock))

    def _check_started(self) -> None:
        """Raise when a worker ended before it connected."""
        for i, call in enumerate(self.calls):
            if call.done():
                try:
                    call.result()  # raises the worker's error
                except UnitError as exc:  # its process died
                    raise RuntimeError(f"load worker {i} exited while starting ({exc.problem})") from None
                raise RuntimeError(f"load worker {i} ended while starting")

    def start(self, loop: asyncio.AbstractEventLoop, t0: float, on_item: Callable[[tuple], None],
              on_lost: Callable[[int, list[int]], None]) -> None:
        """Send the run's clock zero (driver monotonic) and read the workers' batches on ``loop``.
        ``on_lost(worker, request ids it held)`` when a worker's connection closes mid-run."""
        self.loop = loop
        self.on_item = on_item
        self.on_lost = on_lost
        self.frames = [Frames() for _ in self.socks]
        self.outs = []
        for i, sock in enumerate(self.socks):
            send_msg(sock, [("t0", t0)])
            sock.setblocking(False)
            self.outs.append(Outbox(sock, loop, lambda i=i: self._lost(i)))
            loop.add_reader(sock.fileno(), self._readable, i)

    def submit(self, req: Request, inst: int, priority: int | None, prompt_text: str | None,
               planned_send_s: float) -> int:
        """Hand a dispatched request to the least-loaded live worker; returns the worker's id."""
        i = min((j for j in range(self.n) if self.alive[j]), key=self.load.__getitem__)
        self.load[i] += 1
        self.worker_of[req.request_id] = i
        self.outbox[i].append(("send", req, inst, priority, prompt_text, planned_send_s))
        if not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self._flush)
        return i

    def _flush(self) -> None:
        self._flush_pending = False
        for i, box in enumerate(self.outbox):
            if not box:
                continue
            self.outbox[i] = []
            if not self.alive[i]:
                continue
            self.outs[i].write(box)

    def _readable(self, i: int) -> None:
        try:
            data = self.socks[i].recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost(i)
            return
        for batch in self.frames[i].feed(data):
            for item in batch:
                kind = item[0]
                if kind == "done":
                    w = self.worker_of.pop(item[1], None)
                    if w is not None:
                        self.load[w] -= 1
                elif kind == "ping":  # a worker re-measuring its clock offset: answer at once
                    self.outs[i].write([("pong", item[2], time.monotonic())])
                    continue
                elif kind == "clock":
                    self._set_clock(i, ClockOffset(item[2], item[3]))
                    continue
                self.on_item(item)

    def _lost(self, i: int) -> None:
        if not self.alive[i]:
            return
        self.alive[i] = False
        if self.loop is not None:
            self.loop.remove_reader(self.socks[i].fileno())
            self.loop.remove_writer(self.socks[i].fileno())
        held = [rid for rid, w in self.worker_of.items() if w == i]
        self.on_lost(i, held)

    def close(self) -> None:
        for i, sock in enumerate(self.socks):
            try:
                if self.loop is not None and self.alive[i]:
                    self.loop.remove_reader(sock.fileno())
                    self.outs[i].drain_blocking()
                sock.setblocking(True)
                sock.settimeout(2.0)
                send_msg(sock, [("stop",)])
            except (OSError, ValueError):
                pass
        if self.pool is not None:
            self.pool.close()  # processes get 5 s to return from the stop, then are terminated
        for sock in self.socks:
            sock.close()


def worker_summary(info: list[WorkerInfo], sends: Any,
                   clock_history: list[list[tuple[float, ClockOffset]]] | None = None) -> list[dict]:
    """One row per worker (a Ray actor's with its ``node``): clock offset (ms, the last measured) and its error
    bound (half the minimum round trip), with ``clock_history``: re-measurements during the run and the drift
    (last offset minus the one measured before the run, ms); requests sent, dispatch lag
    ``actual_send_s - planned_send_s`` p50 / p99 / max (ms, the driver's clock). ``sends``: a polars frame of the
    records' ``load_worker``, ``actual_send_s`` and ``planned_send_s`` (a request no worker took has no
    ``load_worker``)."""
    rows = []
    for w in info:
        mine = sends.filter(sends["load_worker"] == w.worker)
        lag = (mine["actual_send_s"] - mine["planned_send_s"]).drop_nulls().to_numpy() * 1e3
        node = {"node": w.node} if w.node else {}
        rows.append({"worker": w.worker, "host": w.host, "pid": w.pid, **node,
                     "clock_offset_ms": w.clock.offset_s * 1e3, "clock_error_ms": w.clock.max_error_s * 1e3,
                     **_drift(clock_history[w.worker] if clock_history else []),
                     "requests": mine.height,
                     "lag_p50_ms": float(np.percentile(lag, 50)) if lag.size else None,
                     "lag_p99_ms": float(np.percentile(lag, 99)) if lag.size else None,
                     "lag_max_ms": float(lag.max()) if lag.size else None})
    return rows


def _drift(history: list[tuple[float, ClockOffset]]) -> dict:
    if len(history) < 1:
        return {}
    first, last = history[0][1], history[-1][1]
    return {"clock_resyncs": len(history) - 1, "clock_drift_ms": (last.offset_s - first.offset_s) * 1e3}
