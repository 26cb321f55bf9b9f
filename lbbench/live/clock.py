"""Clock offset between a load worker and the driver, measured by ping-pong (NTP's and AIPerf's estimate).

A worker reads its clock (``t0``), asks the driver for the driver's clock (``t_driver``), and reads its clock
again when the answer arrives (``t1``). If the two legs took equal time, the driver read its clock at the
worker's midpoint ``(t0 + t1) / 2``, so

    offset = (t0 + t1) / 2 - t_driver          (worker clock minus driver clock)

Whatever the legs took, the driver read its clock somewhere inside ``[t0, t1]``, so the estimate is off by at
most half the round trip ``t1 - t0``. Of several rounds the one with the smallest round trip is kept: its bound is
the tightest, and it is the round least disturbed by a busy loop on either side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class ClockOffset:
    """Worker clock minus driver clock, and the round trip of the round it came from (its error bound is half)."""

    offset_s: float
    rtt_s: float

    @property
    def max_error_s(self) -> float:
        return self.rtt_s / 2

    def to_driver(self, worker_t: float) -> float:
        """A worker clock reading on the driver's clock."""
        return worker_t - self.offset_s


def estimate_offset(rounds: Sequence[tuple[float, float, float]]) -> ClockOffset:
    """The offset from ping-pong rounds ``(t0_worker, t_driver, t1_worker)``: the minimum round trip's."""
    if not rounds:
        raise ValueError("clock offset: no ping-pong rounds")
    t0, td, t1 = min(rounds, key=lambda r: r[2] - r[0])
    if t1 < t0:
        raise ValueError(f"clock offset: a round ends before it starts ({t0} > {t1})")
    return ClockOffset(offset_s=(t0 + t1) / 2 - td, rtt_s=t1 - t0)


def measure_offset(worker_clock: Callable[[], float], ask_driver: Callable[[], float],
                   rounds: int = 16) -> ClockOffset:
    """``rounds`` ping-pongs: ``ask_driver()`` sends a ping and returns the driver's clock from its answer."""
    samples = []
    for _ in range(rounds):
        t0 = worker_clock()
        td = ask_driver()
        t1 = worker_clock()
        samples.append((t0, td, t1))
    return estimate_offset(samples)


class ClockSync:
    """Re-measure the offset during a run, every ``every_s`` of the worker's clock: ``rounds`` ping-pongs sent one
    after another over the run's own connection (``ping`` returns the worker's send time, ``pong`` takes it back
    with the driver's clock and returns the new offset once the last round is in). Clocks drift apart (a few ppm
    between machines, more across a VM's migrations): over a long run a single measurement would shift every send
    time and every measured time by the drift. ``history`` keeps every offset applied, the first included."""

    def __init__(self, worker_clock: Callable[[], float], initial: ClockOffset, every_s: float = 60.0,
                 rounds: int = 8):
        self.clock = worker_clock
        self.every_s = every_s
        self.rounds = rounds
        self.offset = initial
        self.history: list[tuple[float, ClockOffset]] = [(worker_clock(), initial)]
        self._samples: list[tuple[float, float, float]] = []
        self._next_s = worker_clock() + every_s
        self._busy = False

    def due(self) -> bool:
        """A re-measurement should start now (none is under way)."""
        return self.every_s > 0 and not self._busy and self.clock() >= self._next_s

    def ping(self) -> float:
        """Start (or continue) a re-measurement: the worker's clock at the ping, to send with it."""
        self._busy = True
        return self.clock()

    def pong(self, t0: float, t_driver: float) -> ClockOffset | None:
        """A pong for the ping sent at ``t0``: the new offset after the last round, else None (send another
        ping)."""
        self._samples.append((t0, t_driver, self.clock()))
        if len(self._samples) < self.rounds:
            return None
        self.offset = estimate_offset(self._samples)
        self._samples = []
        self._busy = False
        now = self.clock()
        self.history.append((now, self.offset))
        self._next_s = now + self.every_s
        return self.offset

    @property
    def drift_s(self) -> float:
        """The offset now minus the offset measured before the run."""
        return self.offset.offset_s - self.history[0][1].offset_s
