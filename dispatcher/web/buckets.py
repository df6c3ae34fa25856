"""Time buckets for the charts: windows, counts per bucket, concurrency, percentiles.

Pure functions of plain numbers (no I/O, no clock): the charts page reads rows from the state
database and hands them here. A window's buckets are aligned to multiples of its step, so two
dashboards opened a few seconds apart ask for the same window and share one cached answer.

Outcomes are data: a bucket counts whatever outcome strings the rows carry, so an outcome
added later (``deferred``, ``oom_killed``) shows up without a change here.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

RANGES: dict[str, tuple[float, float]] = {
    "1h": (3600.0, 60.0),
    "24h": (86400.0, 300.0),
    "7d": (7 * 86400.0, 3600.0),
    "30d": (30 * 86400.0, 4 * 3600.0),
}
"""Range name → (span, step) in seconds: 60, 288, 168 and 180 buckets."""

DEFAULT_RANGE = "24h"
QUANTILES = (50, 90, 99)

KNOWN_ORDER = (
    "completed",
    "failed",
    "tempfail",
    "timed_out",
    "lost",
    "failed_start",
    "spawn_refused",
    "config_error",
    "reclaimed",
    "replaced",
)
"""The order stacked bars draw the outcomes in; any other outcome follows, by name."""


@dataclass(frozen=True)
class Window:
    """``count`` buckets of ``step`` seconds from ``start`` (aligned to a multiple of step)."""

    start: float
    step: float
    count: int

    @property
    def end(self) -> float:
        """Where the last bucket ends."""
        return self.start + self.step * self.count

    def edges(self) -> list[float]:
        """Where each bucket starts."""
        return [self.start + self.step * i for i in range(self.count)]

    def index(self, at: float) -> int | None:
        """The bucket ``at`` falls in (None outside the window)."""
        if at < self.start or at >= self.end:
            return None
        return min(self.count - 1, int((at - self.start) // self.step))


def window(range_name: str, now: float) -> Window:
    """The window of ``range_name`` ending with the bucket that holds ``now``
    (KeyError for an unknown range name)."""
    span, step = RANGES[range_name]
    count = int(span // step)
    last = math.floor(now / step) * step
    return Window(start=last - step * (count - 1), step=step, count=count)


def order_outcomes(seen: Iterable[str]) -> list[str]:
    """``seen`` outcomes in drawing order: the known ones first, then the others by name."""
    found = set(seen)
    known = [o for o in KNOWN_ORDER if o in found]
    return known + sorted(found - set(KNOWN_ORDER))


def count_by(win: Window, rows: Iterable[tuple[float, str]]) -> list[dict[str, int]]:
    """Per bucket, how many ``(at, label)`` rows fall in it by label (outside rows ignored)."""
    counts: list[dict[str, int]] = [{} for _ in range(win.count)]
    for at, label in rows:
        i = win.index(at)
        if i is not None:
            counts[i][label] = counts[i].get(label, 0) + 1
    return counts


def concurrency(win: Window, spans: Iterable[tuple[float, float | None]], now: float) -> list[int]:
    """Per bucket, how many ``(begin, end)`` spans were open at the bucket's end (at ``now``
    for the bucket still running); an end of None means still open. Begin inclusive, end
    exclusive."""
    begins: list[float] = []
    ends: list[float] = []
    for begin, end in spans:
        begins.append(begin)
        if end is not None:
            ends.append(max(end, begin))
    begins.sort()
    ends.sort()
    points = [min(edge + win.step, now) for edge in win.edges()]
    return [bisect.bisect_right(begins, p) - bisect.bisect_right(ends, p) for p in points]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile of ``values`` (None when there are none)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def percentiles_by(
    win: Window, rows: Iterable[tuple[float, float]], quantiles: Sequence[float] = QUANTILES
) -> list[dict[float, float | None]]:
    """Per bucket, the percentiles of the values of the ``(at, value)`` rows in it."""
    values: list[list[float]] = [[] for _ in range(win.count)]
    for at, value in rows:
        i = win.index(at)
        if i is not None:
            values[i].append(value)
    return [{q: percentile(vs, q) for q in quantiles} for vs in values]
