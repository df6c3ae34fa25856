"""When a session's output arrived: the keeper's ``output.times`` next to ``output.log``.

The keeper appends a line ``OFFSET SECONDS`` (a log offset and the wall time) before it stores
new output, at most every 50 ms, so a byte's time is that of the last entry at or before its
offset (output within one step shares the earlier time). :class:`LogTimes` reads the file
incrementally (it grows while the session runs) into the
:class:`~registry.output.log.ArrivalTimes` every registry answers from.

Sessions started before keepers kept times have no such file: :attr:`LogTimes.known` is False.
"""

from __future__ import annotations

import os

from registry.output.log import ArrivalTimes

__all__ = ["LogTimes", "times_path"]


def times_path(log_path: str) -> str:
    """The times file that belongs to a log file."""
    return os.path.join(os.path.dirname(log_path), "output.times")


class LogTimes(ArrivalTimes):
    """The arrival times of one log's output (see the module docstring)."""

    def __init__(self, log_path: str) -> None:
        self.path = times_path(log_path)
        self._read = 0
        self._rest = b""
        super().__init__(known=os.path.exists(self.path))
        self.refresh()

    def refresh(self) -> None:
        """Read the entries added since the last call (a torn last line waits for its end)."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._read)
                data = handle.read()
        except OSError:
            return
        self._known = True
        self._read += len(data)
        *lines, self._rest = (self._rest + data).split(b"\n")
        for line in lines:
            fields = line.split(b" ")
            try:
                offset, at = int(fields[0]), float(fields[1])
            except (IndexError, ValueError):
                continue  # a damaged entry costs its own precision only
            self.note(offset, at)
