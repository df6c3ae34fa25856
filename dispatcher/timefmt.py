"""Timestamps for output: ISO-8601, whole seconds, numeric offset (2026-11-30T09:00:00+01:00)."""

from __future__ import annotations

import datetime as dt
import zoneinfo


def iso(timestamp: float | None, zone: str | None = None) -> str | None:
    """Epoch seconds as ISO-8601 in ``zone`` (default: the host's zone); None stays None."""
    if timestamp is None:
        return None
    tz: dt.tzinfo | None = zoneinfo.ZoneInfo(zone) if zone else None
    moment = dt.datetime.fromtimestamp(int(timestamp), tz=dt.UTC).astimezone(tz)
    return moment.isoformat(timespec="seconds")


def short(timestamp: float | None) -> str:
    """A compact local time for tables (``11-30 09:00:05``); ``-`` for None."""
    if timestamp is None:
        return "-"
    return dt.datetime.fromtimestamp(timestamp).strftime("%m-%d %H:%M:%S")
