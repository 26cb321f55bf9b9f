"""How late an event loop wakes for a planned send: the loop's timers against a timerfd, idle and busy.

One uvloop event loop (what the replay and the load workers run) meets a Poisson schedule of ``--rate`` sends per
second for ``--duration`` seconds and records, per send, how late its callback ran (``time.monotonic()`` minus the
planned time), the wake-ups it took and the process's CPU time. Pacing:

- ``loop``: the load worker's pacing (``lbbench.live.load_workers``): ``call_later`` to ``EARLY_WAKE_S`` (0.2 ms)
  before the send, then ``call_soon`` until it is due (uvloop's timers are millisecond timers);
- ``timerfd``: a Linux timerfd (``CLOCK_MONOTONIC``) armed at the planned time and watched like a socket
  (``loop.add_reader``), through ``ctypes`` (Python 3.11 has no ``os.timerfd_create``): one wake-up per send, to
  the tenth of a millisecond on an idle loop, but it is I/O, so it waits behind the stream reads that became ready
  before it, where a loop timer runs before the loop polls for I/O (docs/reliability.md, Pacing: not kept).

Load on the loop:

- ``idle``: nothing else;
- ``streams``: a child process writes a chunk to each of ``--streams`` sockets every ``--step-ms`` (an engine step
  answering every running stream at once) and the loop reads each and spends ``--chunk-us`` on it (what parsing an
  SSE chunk costs), so sends compete with bursts of I/O callbacks.

The cyclic GC is quieted as in a replay (``lbbench.live.drive.quiet_gc``).

Arms are interleaved per repeat. Prints one line per run (lag p50 / p99 / max, wake-ups per send, CPU) and the
host's load average as each run ends.

    python bench/bench_pacing.py [--rate 80] [--duration 10] [--repeats 3] [--loads idle,streams]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import heapq
import math
import multiprocessing
import os
import random
import resource
import socket
import time

import numpy as np

from lbbench.live.drive import new_event_loop, quiet_gc

EARLY_WAKE_S = 0.0002


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Alarm:
    """``callback()`` on ``loop`` once ``time.monotonic()`` reaches the time last ``set`` (a timerfd)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback) -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self._settime = libc.timerfd_settime
        self._settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                  ctypes.POINTER(_Itimerspec)]
        self.fd = libc.timerfd_create(1, 0o4000 | 0o2000000)  # CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self.loop, self.callback, self.spec = loop, callback, _Itimerspec()
        loop.add_reader(self.fd, self._fired)

    def set(self, at_s: float) -> None:
        sec = int(at_s)
        self.spec.it_value.tv_sec, self.spec.it_value.tv_nsec = sec, int((at_s - sec) * 1e9)
        if self._settime(self.fd, 1, ctypes.byref(self.spec), None) != 0:  # TFD_TIMER_ABSTIME
            raise OSError(ctypes.get_errno(), "timerfd_settime")

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        os.close(self.fd)

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:  # re-armed after it became ready
            return
        self.callback()


def _writer(socks: list[socket.socket], step_s: float, until: float) -> None:
    chunk = b"data: " + b"x" * 180 + b"\n\n"
    nxt = time.monotonic()
    while nxt < until:
        for s in socks:
            s.send(chunk)
        nxt += step_s
        time.sleep(max(0.0, nxt - time.monotonic()))


class Run:
    def __init__(self, pacing: str, planned: list[float]):
        self.pacing, self.planned = pacing, planned
        self.heap = [(t, i) for i, t in enumerate(planned)]
        heapq.heapify(self.heap)
        self.lag = np.zeros(len(planned))
        self.wakes = 0
        self.done = None
        self._timer = None
        self._timer_at = math.inf

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.done = loop.create_future()
        if self.pacing == "timerfd":
            self.alarm = Alarm(loop, self._due)
            self.alarm.set(self.heap[0][0])
        else:
            self._arm()

    # the load worker's former pacing
    def _arm(self) -> None:
        due = self.heap[0][0]
        self._timer_at = due
        delay = due - time.monotonic() - EARLY_WAKE_S
        self._timer = self.loop.call_later(delay, self._due) if delay > 0 else self.loop.call_soon(self._due)

    def _due(self) -> None:
        self.wakes += 1
        heap, now = self.heap, time.monotonic()
        while heap and heap[0][0] <= now:
            t, i = heapq.heappop(heap)
            self.lag[i] = now - t
            now = time.monotonic()
        if not heap:
            self.done.set_result(None)
            if self.pacing == "timerfd":
                self.alarm.close()
            return
        if self.pacing == "timerfd":
            self.alarm.set(heap[0][0])
        elif heap[0][0] - now <= EARLY_WAKE_S:
            self._timer = self.loop.call_soon(self._due)
        else:
            self._arm()


async def one(pacing: str, load: str, rate: float, duration: float, streams: int, step_s: float, chunk_s: float,
              seed: int) -> dict:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    t, planned = time.monotonic() + 0.5, []
    end = t + duration
    while t < end:
        t += rng.expovariate(rate)
        planned.append(t)
    writer = None
    pairs = []
    if load != "idle":
        pairs = [socket.socketpair() for _ in range(streams)]
        for a, _ in pairs:
            a.setblocking(False)

            def on_read(a=a) -> None:
                a.recv(65536)
                stop = time.perf_counter() + chunk_s
                while time.perf_counter() < stop:
                    pass
            loop.add_reader(a.fileno(), on_read)
        writer = multiprocessing.get_context("fork").Process(
            target=_writer, args=([b for _, b in pairs], step_s, end + 0.2), daemon=True)
        writer.start()
    run = Run(pacing, planned)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    run.start(loop)
    await run.done
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    if writer is not None:
        writer.join()
        for a, b in pairs:
            loop.remove_reader(a.fileno())
            a.close()
            b.close()
    lag = run.lag * 1e3
    return {"n": len(planned), "p50": float(np.percentile(lag, 50)), "p99": float(np.percentile(lag, 99)),
            "max": float(lag.max()), "wakes": run.wakes / len(planned),
            "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=80.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pacing", default="loop,timerfd")
    ap.add_argument("--loads", default="idle,streams")
    ap.add_argument("--streams", type=int, default=200, help="streams answered at every step")
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--chunk-us", type=float, default=20.0, help="CPU spent per chunk read")
    args = ap.parse_args()
    for rep in range(args.repeats):
        for load in args.loads.split(","):
            for pacing in args.pacing.split(","):
                loop = new_event_loop()
                try:
                    with quiet_gc():
                        r = loop.run_until_complete(one(pacing, load, args.rate, args.duration, args.streams,
                                                        args.step_ms / 1e3, args.chunk_us / 1e6, rep))
                finally:
                    loop.close()
                print(f"repeat {rep}, load {load:7s}, pacing {pacing:7s} (load average {os.getloadavg()[0]:.2f}): "
                      f"lag p50 {r['p50']:.3f} / p99 {r['p99']:.3f} / max {r['max']:.3f} ms over {r['n']} sends, "
                      f"{r['wakes']:.1f} wake-ups per send, CPU {r['cpu_s']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
