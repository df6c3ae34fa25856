"""Injectable time: everything with a TTL, a deadline or a schedule takes a :class:`Clock`.

Tests use :class:`FakeClock` to move time forward without sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time (epoch seconds) and monotonic time; ``sleep`` for loops that must wait."""

    def time(self) -> float:
        """Seconds since the Unix epoch (wall clock; used for records and schedules)."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds (used for TTLs, timeouts and elapsed times)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait; a fake clock advances instead."""
        ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that only moves when told to (``advance``/``set``); thread-safe."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._lock = threading.Lock()
        self._wall = float(start)
        self._mono = 1000.0

    def time(self) -> float:
        with self._lock:
            return self._wall

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        """Move both wall and monotonic time forward."""
        with self._lock:
            self._wall += seconds
            self._mono += seconds

    def set(self, wall: float) -> None:
        """Jump wall time (monotonic moves by the same amount when going forward)."""
        with self._lock:
            delta = wall - self._wall
            self._wall = wall
            if delta > 0:
                self._mono += delta
