"""Watch patterns: whole-line matching across reads, cooldown, strikes, caps, global breaker.

Pure logic with time passed in (the caller's clock), so tests drive it without waiting:

* :class:`LineBuffer` turns raw output chunks (any split) into whole lines, keeping the byte
  offset of the first byte not yet consumed (persisted, so adoption resumes there);
* :class:`Matcher` tests a line against a session's patterns (substring or regex);
* :class:`WatchGate` decides per session: deliver, suppress (counted) or disable. After a
  delivery, matches within the cooldown are suppressed; a cooldown window that suppressed
  something is a *strike*; at the strike limit, or once the lifetime cap of deliveries is
  reached, watching is disabled and the session falls back to notify-on-complete;
* :class:`Breaker` caps deliveries per minute across all sessions of a registry.
"""

from __future__ import annotations

import enum
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from registry.abc import WatchPattern
from scope.foundation.errors import UsageError

__all__ = [
    "MAX_LINE_BYTES",
    "Breaker",
    "LineBuffer",
    "Matcher",
    "Verdict",
    "WatchGate",
    "parse_patterns",
]

MAX_LINE_BYTES = 64 * 1024
"""A line longer than this is matched in pieces of this size (memory stays bounded)."""
BREAKER_WINDOW = 60.0


def parse_patterns(items: Iterable[str | WatchPattern]) -> tuple[WatchPattern, ...]:
    """Validate watch patterns (strings are substrings); bad ones are usage errors."""
    found: list[WatchPattern] = []
    for item in items:
        pattern = WatchPattern(pattern=item) if isinstance(item, str) else item
        if not pattern.pattern:
            raise UsageError("empty watch pattern", remedy="give a substring or a regex")
        if "\n" in pattern.pattern:
            raise UsageError(
                f"watch pattern {pattern.pattern!r} spans lines",
                remedy="patterns are matched against single lines",
            )
        if pattern.regex:
            try:
                re.compile(pattern.pattern)
            except re.error as err:
                raise UsageError(
                    f"invalid watch regex {pattern.pattern!r}: {err}",
                    remedy="fix the expression (Python re syntax)",
                ) from None
        found.append(pattern)
    return tuple(found)


class LineBuffer:
    """Whole lines from chunks of raw output, however they were split.

    ``offset`` is the log position of the first byte not yet part of a returned line.
    ``fill(start, end)`` reads log bytes the buffer missed (a gap between ``offset`` and the
    start of a chunk it is given)."""

    def __init__(self, offset: int = 0, fill: Callable[[int, int], bytes] | None = None) -> None:
        self.offset = offset
        self._partial = b""
        self._fill = fill

    @property
    def end(self) -> int:
        """Log position just after the bytes seen so far."""
        return self.offset + len(self._partial)

    def feed(self, start: int, data: bytes) -> list[bytes]:
        """Add the chunk that begins at log position ``start``; returns complete lines
        (without their newline)."""
        end = self.end
        if start > end and self._fill is not None:
            filled = self._fill(end, start)
            if len(filled) < start - end:
                # The fill kept only the end of a huge gap (from a line start): the partial
                # line before the gap is broken, and counting resumes where the fill begins.
                self._partial = b""
                self.offset = start - len(filled)
            data = filled + data
        elif start < end:
            data = data[end - start :]  # seen already
        if not data:
            return []
        buffer = self._partial + data
        lines: list[bytes] = []
        begin = 0
        while True:
            newline = buffer.find(b"\n", begin)
            if newline < 0:
                break
            lines.append(buffer[begin:newline])
            begin = newline + 1
        rest = buffer[begin:]
        while len(rest) > MAX_LINE_BYTES:
            lines.append(rest[:MAX_LINE_BYTES])
            begin += MAX_LINE_BYTES
            rest = rest[MAX_LINE_BYTES:]
        self.offset += begin
        self._partial = rest
        return lines

    def flush(self) -> list[bytes]:
        """End of stream: the unterminated last line, if any."""
        rest, self._partial = self._partial, b""
        self.offset += len(rest)
        return [rest] if rest else []


class Matcher:
    """A session's patterns, compiled."""

    def __init__(self, patterns: Sequence[WatchPattern]) -> None:
        self.patterns = tuple(patterns)
        self._tests: list[tuple[WatchPattern, Callable[[str], bool]]] = []
        for p in self.patterns:
            if p.regex:
                self._tests.append((p, re.compile(p.pattern).search))  # type: ignore[arg-type]
            else:
                needle = p.pattern
                self._tests.append((p, lambda line, n=needle: n in line))  # type: ignore[misc]

    def match(self, line: str) -> WatchPattern | None:
        """The first pattern the line matches."""
        for pattern, test in self._tests:
            if test(line):
                return pattern
        return None


def decode_line(raw: bytes) -> str:
    """A line as text (invalid UTF-8 replaced; a trailing CR from a terminal dropped)."""
    return raw.decode("utf-8", "replace").removesuffix("\r")


class Verdict(enum.StrEnum):
    """What :meth:`WatchGate.offer` decided."""

    DELIVER = "deliver"
    SUPPRESS = "suppress"
    DISABLE = "disable"
    """Watching stops now (the matches are suppressed); fall back to notify-on-complete."""


@dataclass(kw_only=True)
class WatchGate:
    """One session's delivery policy and counters (mutable; the caller serializes)."""

    cooldown: float
    strike_limit: int
    lifetime_cap: int
    deliveries: int = 0
    strikes: int = 0
    disabled: str | None = None
    """Why watching stopped, or None."""
    window_until: float | None = None
    window_dropped: int = 0
    suppressed: int = 0
    """Matches suppressed since the last delivery (reported with the next one)."""
    suppressed_total: int = 0
    breaker_suppressed: int = 0

    def offer(self, now: float, count: int, *, breaker_open: bool) -> Verdict:
        """``count`` matching lines arrived at ``now``: deliver them as one event, suppress
        them, or disable watching."""
        if self.disabled is not None:
            self._suppress(count)
            return Verdict.SUPPRESS
        if self.window_until is not None and now >= self.window_until:
            if self.window_dropped:
                self.strikes += 1
            self.window_until = None
            self.window_dropped = 0
            if self.strikes >= self.strike_limit:
                self.disabled = (
                    f"{self.strikes} cooldown windows had suppressed matches "
                    f"(registry.watch_strikes)"
                )
                self._suppress(count)
                return Verdict.DISABLE
        if self.window_until is not None:
            self.window_dropped += count
            self._suppress(count)
            return Verdict.SUPPRESS
        if breaker_open:
            self.breaker_suppressed += count
            self._suppress(count)
            return Verdict.SUPPRESS
        if self.deliveries >= self.lifetime_cap:
            self.disabled = (
                f"lifetime cap of {self.lifetime_cap} watch events reached "
                "(registry.watch_max_deliveries)"
            )
            self._suppress(count)
            return Verdict.DISABLE
        self.deliveries += 1
        self.window_until = now + self.cooldown
        return Verdict.DELIVER

    def _suppress(self, count: int) -> None:
        self.suppressed += count
        self.suppressed_total += count

    def take_suppressed(self) -> int:
        """Suppressed since the last delivery (and reset that count)."""
        count, self.suppressed = self.suppressed, 0
        return count

    def to_json(self, offset: int) -> dict[str, Any]:
        """The persisted form (monotonic times are not persisted: they mean nothing to another
        process)."""
        return {
            "deliveries": self.deliveries,
            "strikes": self.strikes,
            "disabled": self.disabled,
            "suppressed": self.suppressed,
            "suppressed_total": self.suppressed_total,
            "breaker_suppressed": self.breaker_suppressed,
            "offset": offset,
        }

    def load(self, state: Mapping[str, Any]) -> int:
        """Restore persisted counters; returns the persisted line offset."""
        self.deliveries = int(state.get("deliveries") or 0)
        self.strikes = int(state.get("strikes") or 0)
        self.disabled = state.get("disabled") or None
        self.suppressed = int(state.get("suppressed") or 0)
        self.suppressed_total = int(state.get("suppressed_total") or 0)
        self.breaker_suppressed = int(state.get("breaker_suppressed") or 0)
        return int(state.get("offset") or 0)


class Breaker:
    """At most ``limit`` deliveries per minute across all sessions."""

    def __init__(self, limit: int, window: float = BREAKER_WINDOW) -> None:
        self.limit = limit
        self.window = window
        self._times: deque[float] = deque()
        self.tripped = 0
        """How many times it opened."""
        self._open = False

    def is_open(self, now: float) -> bool:
        """Whether deliveries are suppressed now."""
        while self._times and self._times[0] <= now - self.window:
            self._times.popleft()
        is_open = len(self._times) >= self.limit
        if is_open and not self._open:
            self.tripped += 1
        self._open = is_open
        return is_open

    def record(self, now: float) -> None:
        """A delivery happened."""
        self._times.append(now)
