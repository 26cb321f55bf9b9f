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
