"""Clocks the driver reads: wall time for real backends, simulated time for the simulator.

Every time the core sees (an event's `at`, a scoring start, a reward deadline) comes from the
driver's clock, so the same driver runs real engines against `WallClock` and the simulator against
`VirtualClock`, which only the simulator moves.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an origin fixed for the clock's life (never decreasing)."""
        ...


class WallClock:
    """Seconds since construction, from `time.perf_counter`."""

    def __init__(self) -> None:
        self._origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._origin


class VirtualClock:
    """Simulated seconds: stands still until the simulator moves it forward."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, at: float) -> None:
        """Move to `at`; a time in the past leaves the clock where it is."""
        self._now = max(self._now, at)
