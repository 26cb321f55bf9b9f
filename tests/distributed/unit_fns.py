"""Unit functions for the executor tests (a module of their own so that worker processes import them)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DyingUnit:
    """A unit whose worker process exits without a word: once (``times=1``: the marker file then exists) or
    every time (``times=None``)."""

    label: str
    value: int
    marker_dir: str = ""
    times: int | None = 0

    def __str__(self) -> str:
        return self.label


def square_or_die(unit: DyingUnit) -> int:
    if unit.times != 0:
        marker = Path(unit.marker_dir) / f"{unit.label}.died"
        if unit.times is None or not marker.exists():
            marker.touch()
            os._exit(1)
    return unit.value * unit.value


def slow_square(unit: tuple[str, int]) -> int:
    """Marks that it started (a file in the directory ``unit[0]``), then takes half a second."""
    Path(unit[0], f"{unit[1]}.started").touch()
    time.sleep(0.5)
    return unit[1] * unit[1]


class Counter:
    """A worker that keeps state: a running total and the number of calls it served since it was built."""

    def __init__(self, start: int = 0):
        self.total = start
        self.calls = 0

    def add(self, x: int) -> int:
        self.calls += 1
        self.total += x
        return self.total

    def served(self) -> int:
        return self.calls

    def pid(self) -> int:
        return os.getpid()

    def scaled(self, factor: int, unit: DyingUnit) -> int:
        """``factor * unit.value ** 2``, exiting the worker's process as ``square_or_die`` does."""
        self.calls += 1
        return factor * square_or_die(unit)

    def slow(self, unit: tuple[str, int]) -> int:
        self.calls += 1
        return slow_square(unit)

    def fail(self) -> None:
        raise ValueError("asked to fail")

    def wait_for(self, path: str) -> str:
        """Returns once ``path`` exists (a long call)."""
        while not Path(path).exists():
            time.sleep(0.02)
        return path
