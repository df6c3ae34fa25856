"""When a session's output arrived: the keeper's ``output.times`` next to ``output.log``.

The keeper appends a line ``OFFSET SECONDS`` (a log offset and the wall time) before it stores
new output, at most every 50 ms, so a byte's time is that of the last entry at or before its
offset (output within one step shares the earlier time). :class:`LogTimes` reads the file
incrementally (it grows while the session runs); :class:`Stamper` prefixes each line of a log
stream with the time its first byte arrived (``dispatch logs --timestamps``).

Sessions started before keepers kept times have no such file: :attr:`LogTimes.known` is False.
"""

from __future__ import annotations

import bisect
import datetime as dt
import os
from collections.abc import Callable

__all__ = ["LogTimes", "Stamper", "times_path"]


def times_path(log_path: str) -> str:
    """The times file that belongs to a log file."""
    return os.path.join(os.path.dirname(log_path), "output.times")


class LogTimes:
    """The arrival times of one log's output (see the module docstring)."""

    def __init__(self, log_path: str) -> None:
        self.path = times_path(log_path)
        self.offsets: list[int] = []
        self.times: list[float] = []
        self._read = 0
        self._rest = b""
        self.known = os.path.exists(self.path)
        self.refresh()

    def refresh(self) -> None:
        """Read the entries added since the last call (a torn last line waits for its end)."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._read)
                data = handle.read()
        except OSError:
            return
        self.known = True
        self._read += len(data)
        *lines, self._rest = (self._rest + data).split(b"\n")
        for line in lines:
            fields = line.split(b" ")
            try:
                offset, at = int(fields[0]), float(fields[1])
            except (IndexError, ValueError):
                continue  # a damaged entry costs its own precision only
            if self.offsets and offset < self.offsets[-1]:
                continue
            self.offsets.append(offset)
            self.times.append(at)

    def time_at(self, offset: int) -> float | None:
        """When the byte at ``offset`` arrived (None before the first entry)."""
        if self.offsets and offset > self.offsets[-1]:
            self.refresh()
        index = bisect.bisect_right(self.offsets, offset) - 1
        return self.times[index] if index >= 0 else None

    def offset_since(self, moment: float) -> int | None:
        """The first log offset whose output arrived at or after ``moment`` (None: nothing
        arrived since)."""
        self.refresh()
        index = bisect.bisect_left(self.times, moment)
        return self.offsets[index] if index < len(self.offsets) else None


def _iso(moment: float) -> str:
    return dt.datetime.fromtimestamp(moment).astimezone().isoformat(timespec="milliseconds")


class Stamper:
    """Prefixes every line of a log stream with its arrival time (ISO-8601, milliseconds,
    the viewer's zone); feed it the bytes in order from ``offset``."""

    def __init__(self, times: LogTimes, offset: int, *, fmt: Callable[[float], str] = _iso) -> None:
        self.times = times
        self.offset = offset
        self.fmt = fmt
        self.at_line_start = True

    def __call__(self, data: bytes) -> bytes:
        out = bytearray()
        start = 0
        while start < len(data):
            if self.at_line_start:
                moment = self.times.time_at(self.offset + start)
                out += (self.fmt(moment) if moment is not None else "-").encode() + b" "
            end = data.find(b"\n", start)
            if end < 0:
                out += data[start:]
                self.at_line_start = False
                break
            out += data[start : end + 1]
            start = end + 1
            self.at_line_start = True
        self.offset += len(data)
        return bytes(out)
