"""Heartbeats: per-session schedules and the output written since the previous heartbeat.

A heartbeat carries only what the log gained since the last one. The position is a byte
offset into the log (the total-bytes counter), persisted with every heartbeat in the same
transaction as the event, so a registry that adopts the session later continues exactly where
the last heartbeat stopped: concatenated, the heartbeats' outputs are the worker's output.
An offset never splits a UTF-8 character: an incomplete sequence at the end waits for the next
heartbeat (or for the completion).

Times are the registry clock's (injectable): :class:`Slot` keeps the next due time on the
clock's monotonic scale; the persisted ``hb_at`` is wall time, converted on adoption.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from registry.abc import HEARTBEAT_FLOOR

__all__ = ["EXACT_DELTA_BYTES", "Delta", "Slot", "clamp_interval", "read_delta"]

EXACT_DELTA_BYTES = 1 << 20
"""Deltas up to this size are decoded whole (exact ``output_cut``); beyond, only the end is
read and the skipped bytes count as characters."""


def clamp_interval(seconds: float) -> float:
    """The interval actually used: at least :data:`HEARTBEAT_FLOOR`."""
    return max(HEARTBEAT_FLOOR, float(seconds))


@dataclass(kw_only=True)
class Slot:
    """One session's heartbeat schedule (mutable; the timer serializes access)."""

    session_id: str
    log_path: str
    interval: float
    liveness: bool
    chars: int
    offset: int
    due: float
    """Clock-monotonic time of the next heartbeat."""


@dataclass(frozen=True, kw_only=True)
class Delta:
    """The output between two heartbeat offsets."""

    text: str
    """The last ``chars`` characters of it."""
    cut: int
    """Characters of it not in ``text``."""
    start: int
    end: int
    """The next heartbeat starts here (never inside a UTF-8 character)."""

    @property
    def nbytes(self) -> int:
        """Bytes covered."""
        return self.end - self.start


def read_delta(path: str, start: int, chars: int, *, limit: int = EXACT_DELTA_BYTES) -> Delta:
    """The log bytes from ``start`` to its current end, as text (see the module docstring)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return Delta(text="", cut=0, start=start, end=start)
    try:
        size = os.fstat(fd).st_size
        if size <= start:
            return Delta(text="", cut=0, start=start, end=start)
        begin = start if size - start <= limit else size - limit
        data = os.pread(fd, size - begin, begin)
    finally:
        os.close(fd)
    skipped = begin - start
    if skipped:
        lead = 0
        while lead < min(len(data), 3) and 0x80 <= data[lead] < 0xC0:
            lead += 1
        skipped += lead
        data = data[lead:]
    data = data[: len(data) - _incomplete_tail(data)]
    text = data.decode("utf-8", "replace")
    shown = text[-chars:] if chars > 0 else ""
    return Delta(
        text=shown,
        cut=skipped + len(text) - len(shown),
        start=start,
        end=start + skipped + len(data),
    )


def _incomplete_tail(data: bytes) -> int:
    """Length of a UTF-8 sequence cut off at the end of ``data`` (0 when it ends cleanly)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return 0
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if back < need else 0
    return 0
