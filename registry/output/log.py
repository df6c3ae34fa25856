"""A session's raw log, read the one way every registry reads it.

A registry hands this module a :class:`LogSource`: :class:`FileLog` (the real registry's
``output.log``, never held open between reads) or :class:`BufferLog` (the fake's bytes in
memory). Everything else works on a source, so the real and the fake registry read alike:

* :func:`select` chooses bytes: a range, the lines since a moment (:class:`ArrivalTimes`), the
  last N lines (:func:`tail_start`, the one tail of a log), the first N bytes;
* :class:`Presenter` presents them: arrival-time stamps (:class:`Stamper`), then the output
  hooks on whole lines (:class:`~registry.output.hooks.LineHooks`);
* :class:`Following` follows a growing log until its session ends (:meth:`Registry.follow_log
  <registry.abc.Registry.follow_log>`).

Bytes are never changed unless a presentation is asked for: ``dispatch logs`` shows them raw.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable
from typing import Protocol

from registry.abc import LogFollow, OutputTimes, Registry, Session, Stamp
from registry.output.hooks import LineHooks

__all__ = [
    "ArrivalTimes",
    "BufferLog",
    "FileLog",
    "Following",
    "LogReader",
    "LogSource",
    "Presenter",
    "Stamper",
    "line_start",
    "read",
    "select",
    "tail_start",
]

BLOCK = 64 * 1024
"""How much of a log is read at a time when looking backwards for lines."""
FOLLOW_STEP = 0.1
"""The longest a follow waits before looking at the log again (the registry's bounded wait
wakes it early when the session ends)."""


class LogSource(Protocol):
    """Where a session's log bytes are."""

    def size(self) -> int | None:
        """Bytes in the log now (None: there is no log)."""
        ...

    def read(self, start: int, end: int) -> bytes:
        """The bytes from ``start`` up to ``end`` (fewer at the end of the log; b"" when it
        does not exist)."""
        ...


class FileLog:
    """A log file, opened for each read and closed again (a registry may follow hundreds)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def size(self) -> int | None:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return None

    def read(self, start: int, end: int) -> bytes:
        start = max(0, start)
        want = end - start
        if want <= 0:
            return b""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return b""
        try:
            chunks: list[bytes] = []
            got = 0
            while got < want:
                data = os.pread(fd, min(want - got, 4 << 20), start + got)
                if not data:
                    break
                chunks.append(data)
                got += len(data)
        finally:
            os.close(fd)
        return b"".join(chunks)


class LogReader:
    """Reads what was appended to a log (a file path, or any source) since the last call."""

    def __init__(self, log: LogSource | str | os.PathLike[str], offset: int = 0) -> None:
        self.log: LogSource = FileLog(log) if isinstance(log, str | os.PathLike) else log
        self.offset = offset

    def size(self) -> int:
        """Current size of the file (0 when it does not exist yet)."""
        return self.log.size() or 0

    def read_new(self, limit: int = 64 << 20) -> bytes:
        """Bytes appended since the last read (at most ``limit``); b"" when nothing is new."""
        size = self.size()
        if size <= self.offset:
            return b""
        data = self.log.read(self.offset, min(size, self.offset + limit))
        self.offset += len(data)
        return data


class BufferLog:
    """A log kept in memory (the fake registry's)."""

    def __init__(self, data: bytearray) -> None:
        self.data = data

    def size(self) -> int | None:
        return len(self.data)

    def read(self, start: int, end: int) -> bytes:
        return bytes(self.data[max(0, start) : max(0, end)])


class ArrivalTimes(OutputTimes):
    """Arrival times from (offset, wall time) notes in log order (see
    :class:`~registry.abc.OutputTimes`); :meth:`refresh` is where a subclass reads new notes."""

    def __init__(self, *, known: bool = True) -> None:
        self.offsets: list[int] = []
        self.times: list[float] = []
        self._known = known

    @property
    def known(self) -> bool:
        return self._known

    def note(self, offset: int, at: float) -> None:
        """Output from ``offset`` on arrived at ``at`` (an offset before the last is ignored)."""
        if self.offsets and offset < self.offsets[-1]:
            return
        self.offsets.append(offset)
        self.times.append(at)

    def refresh(self) -> None:
        """Take notes added elsewhere since the last call (nothing to take here)."""

    def time_at(self, offset: int) -> float | None:
        if self.offsets and offset > self.offsets[-1]:
            self.refresh()
        index = bisect.bisect_right(self.offsets, offset) - 1
        return self.times[index] if index >= 0 else None

    def offset_since(self, moment: float) -> int | None:
        self.refresh()
        index = bisect.bisect_left(self.times, moment)
        return self.offsets[index] if index < len(self.offsets) else None


def tail_start(log: LogSource, count: int, start: int, end: int) -> int:
    """Where the last ``count`` lines of the log's bytes from ``start`` to ``end`` begin (a
    last line without a newline counts; ``end`` for none)."""
    if count <= 0:
        return end
    pos = end
    data = b""
    while pos > start:
        step = min(BLOCK, pos - start)
        pos -= step
        data = log.read(pos, pos + step) + data
        body = data[:-1] if data.endswith(b"\n") else data
        if body.count(b"\n") >= count:
            break
    kept = b"".join(data.splitlines(keepends=True)[-count:])
    return end - len(kept)


def line_start(log: LogSource, offset: int, end: int) -> int:
    """The first line start at or after ``offset`` (``offset`` itself when a line starts
    there; ``end`` when no line starts before it)."""
    if offset <= 0:
        return 0
    pos = offset - 1
    while pos < end:
        data = log.read(pos, min(end, pos + BLOCK))
        if not data:
            break
        newline = data.find(b"\n")
        if newline >= 0:
            return min(end, pos + newline + 1)
        pos += len(data)
    return end


def select(
    log: LogSource,
    times: Callable[[], OutputTimes],
    *,
    byte_range: tuple[int, int] | None = None,
    since: float | None = None,
    tail_lines: int | None = None,
    head: int | None = None,
) -> tuple[int, int]:
    """The (start, end) of the bytes :meth:`Registry.read_log <registry.abc.Registry.read_log>`
    selects, in its order: the range, the lines since ``since``, the last lines, the head."""
    if byte_range is not None:
        start, end = max(0, byte_range[0]), max(0, byte_range[1])
    else:
        start, end = 0, log.size() or 0
    if since is not None:
        first = times().offset_since(since)
        start = end if first is None else max(start, line_start(log, min(first, end), end))
    if tail_lines is not None:
        start = tail_start(log, tail_lines, start, end)
    if head is not None:
        end = min(end, start + max(0, head))
    return start, max(start, end)


class Stamper:
    """Starts every line of a log stream with its arrival time; feed it the bytes in order
    from ``offset``."""

    def __init__(self, times: OutputTimes, offset: int, fmt: Stamp) -> None:
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


class Presenter:
    """Raw log bytes as asked for: stamped, then hooked line by line (or untouched)."""

    def __init__(self, *, stamper: Stamper | None = None, lines: LineHooks | None = None) -> None:
        self.stamper = stamper
        self.lines = lines

    @classmethod
    def asked(
        cls,
        offset: int,
        *,
        times: Callable[[], OutputTimes],
        stamp: Stamp | None = None,
        hooks: Callable[[str], str] | None = None,
    ) -> Presenter:
        """The presentation of bytes from ``offset`` on: ``stamp`` (with ``times``), then
        ``hooks`` (a registry's output hooks for the session)."""
        return cls(
            stamper=Stamper(times(), offset, stamp) if stamp is not None else None,
            lines=LineHooks(hooks) if hooks is not None else None,
        )

    def __call__(self, data: bytes) -> bytes:
        if self.stamper is not None:
            data = self.stamper(data)
        return self.lines(data) if self.lines is not None else data

    def finish(self) -> bytes:
        """What a presentation held back (a last line without its newline)."""
        return self.lines.finish() if self.lines is not None else b""


def read(
    log: LogSource,
    times: Callable[[], OutputTimes],
    *,
    head: int | None = None,
    tail_lines: int | None = None,
    byte_range: tuple[int, int] | None = None,
    since: float | None = None,
    stamp: Stamp | None = None,
    hooks: Callable[[str], str] | None = None,
) -> bytes:
    """What :meth:`Registry.read_log <registry.abc.Registry.read_log>` returns, from ``log``
    (``times`` gives its arrival times; ``hooks`` are the session's output hooks, when
    asked for)."""
    start, end = select(
        log, times, byte_range=byte_range, since=since, tail_lines=tail_lines, head=head
    )
    presenter = Presenter.asked(start, times=times, stamp=stamp, hooks=hooks)
    return presenter(log.read(start, end)) + presenter.finish()


class Following(LogFollow):
    """Follows ``log`` from ``offset`` until ``registry`` reports the session final, or until
    ``timeout`` seconds passed (see :class:`~registry.abc.LogFollow`)."""

    def __init__(
        self,
        registry: Registry,
        session_id: str,
        log: LogSource,
        offset: int,
        presenter: Presenter,
        *,
        timeout: float | None = None,
    ) -> None:
        self.registry = registry
        self.session_id = session_id
        self.reader = LogReader(log, offset)
        self.presenter = presenter
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._over = False
        self._final: Session | None = None

    @property
    def offset(self) -> int:
        return self.reader.offset

    def read_new(self, limit: int = 4 << 20) -> bytes:
        return self.presenter(self.reader.read_new(limit))

    def __next__(self) -> bytes:
        while not self._over:
            if self.reader.size() > self.reader.offset:
                data = self.read_new()
                if data:
                    return data
                continue  # held back (a line without its newline yet): read on
            if self._final is not None:
                # Everything it wrote before it ended was read: let out what was held back.
                self._over = True
                self.session = self._final
                rest = self.presenter.finish()
                if rest:
                    return rest
                break
            current = self.registry.get(self.session_id)
            if current.finished:
                self._final = current
                continue  # what it wrote before it ended is in the log now
            remaining = None if self._deadline is None else self._deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                self._over = True
                break
            wait = FOLLOW_STEP if remaining is None else min(FOLLOW_STEP, remaining)
            self.registry.wait(self.session_id, timeout=wait)
        raise StopIteration
