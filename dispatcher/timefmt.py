"""How times look: one rule for every human view, ISO-8601 for every JSON document.

- ``--json``: :func:`iso`, ISO-8601 with a numeric offset and whole seconds
  (``2026-11-30T09:00:00+01:00``).
- People: :class:`TimeView`, the viewer's local time (or a named zone, e.g. a cron job's) with
  the zone shown, the date only when it is not today in that zone (``09:00:05 CET``,
  ``2026-11-29 23:10:00 CET``), and where operators scan a list the distance from now as
  ``systemctl list-timers`` shows it (``in 4m``, ``3h12m ago``).

A view takes ``now`` from its caller, so tests fix the clock and the zone.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from dataclasses import dataclass

# zoneinfo is imported where a named zone is loaded: printing a time in the host's own zone
# (`kanban defer`'s answer, every --json time) needs none.

__all__ = ["TimeView", "iso", "relative", "span", "viewer_zone"]

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def iso(timestamp: float | None, zone: str | None = None) -> str | None:
    """Epoch seconds as ISO-8601 in ``zone`` (default: the host's zone); None stays None."""
    if timestamp is None:
        return None
    tz: dt.tzinfo | None = _zone(zone) if zone else None
    moment = dt.datetime.fromtimestamp(int(timestamp), tz=dt.UTC).astimezone(tz)
    return moment.isoformat(timespec="seconds")


def span(seconds: float) -> str:
    """A length of time, largest unit first: ``45s``, ``4m``, ``3h12m``, ``2d5h``.

    The second unit is shown only while the first is below 10 (``3h12m`` but ``14h``), which
    keeps list columns short without hiding what matters for short spans."""
    rest = int(abs(seconds))
    for index, (unit, size) in enumerate(_UNITS):
        if rest >= size or size == 1:
            count, rest = divmod(rest, size)
            text = f"{count}{unit}"
            if count < 10 and index + 1 < len(_UNITS):
                small, small_size = _UNITS[index + 1]
                if rest // small_size:
                    text += f"{rest // small_size}{small}"
            return text
    return "0s"  # unreachable: the last unit always matches


def relative(timestamp: float, now: float) -> str:
    """``in 4m``, ``3h12m ago`` or ``now`` (within a second)."""
    delta = timestamp - now
    if abs(delta) < 1:
        return "now"
    return f"in {span(delta)}" if delta > 0 else f"{span(delta)} ago"


def viewer_zone(environ: Mapping[str, str]) -> dt.tzinfo | None:
    """The zone ``TZ`` in ``environ`` names (an IANA name or a zoneinfo path), else None: the
    system's local zone."""
    name = environ.get("TZ", "").strip().removeprefix(":")
    if "zoneinfo/" in name:
        name = name.split("zoneinfo/", 1)[1].removeprefix("posix/").removeprefix("right/")
    if not name:
        return None
    import zoneinfo

    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return None


def _zone(name: str) -> dt.tzinfo:
    import zoneinfo

    return zoneinfo.ZoneInfo(name)


@dataclass(frozen=True, kw_only=True)
class TimeView:
    """Times for people, as seen at ``now`` from ``zone`` (None: the system's local zone)."""

    now: float
    zone: dt.tzinfo | None = None
    stable: bool = False
    """Absolute times only (``--watch`` into a file: a snapshot must not differ merely
    because "3s ago" became "5s ago")."""

    @classmethod
    def local(cls, environ: Mapping[str, str] | None = None) -> TimeView:
        """The real clock, in the zone of ``environ``'s ``TZ`` (or the system's)."""
        return cls(now=time.time(), zone=viewer_zone(environ or {}))

    def _moment(self, timestamp: float, zone: str | None) -> dt.datetime:
        tz = _zone(zone) if zone else self.zone
        return dt.datetime.fromtimestamp(int(timestamp), tz=dt.UTC).astimezone(tz)

    def at(self, timestamp: float | None, zone: str | None = None) -> str:
        """``09:00:05 CET`` today, ``2026-11-29 23:10:00 CET`` another day; ``-`` for None.
        ``zone`` shows the time in that IANA zone instead of the viewer's (a cron job's)."""
        if timestamp is None:
            return "-"
        moment = self._moment(timestamp, zone)
        today = self._moment(self.now, zone).date()
        clock = moment.strftime("%H:%M:%S")
        name = moment.tzname() or moment.strftime("%z")
        if moment.date() != today:
            return f"{moment.date().isoformat()} {clock} {name}"
        return f"{clock} {name}"

    def ago(self, timestamp: float | None) -> str:
        """Only the distance from now (``in 4m``, ``3h ago``); ``-`` for None."""
        if timestamp is None:
            return "-"
        return self.at(timestamp) if self.stable else relative(timestamp, self.now)

    def both(self, timestamp: float | None, zone: str | None = None) -> str:
        """``09:00:05 CET (3h ago)``: for lists an operator scans; ``-`` for None."""
        if timestamp is None:
            return "-"
        if self.stable:
            return self.at(timestamp, zone)
        return f"{self.at(timestamp, zone)} ({relative(timestamp, self.now)})"
