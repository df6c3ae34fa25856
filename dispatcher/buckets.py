"""Time buckets for the history pages: windows, counts per bucket, percentiles, queue depth.

Pure functions of plain numbers (no I/O, no clock): the board store and the cron ledger answer
per-bucket questions with indexed range reads (:mod:`dispatcher.kanban.sqlhistory`,
:mod:`dispatcher.cron.history`) streamed through a :class:`Tally`, as the in-memory stores
stream their records, and the web draws what comes back. A window's buckets are
aligned to multiples of its step, so two dashboards opened a few seconds apart ask for the same
buckets and share one cached answer per bucket.

Outcomes are data: a bucket counts whatever outcome strings the rows carry, so an outcome added
later shows up without a change here.

Percentiles are nearest-rank: the ``q``-th percentile of ``n`` values is the value at rank
``ceil(q * n / 100)`` of the sorted values (:func:`rank`), always one of the values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RANGES: dict[str, tuple[float, float]] = {
    "1h": (3600.0, 15.0),
    "24h": (86400.0, 300.0),
    "7d": (7 * 86400.0, 1800.0),
    "30d": (30 * 86400.0, 7200.0),
}
"""Range name → (span, step) in seconds: 240, 288, 336 and 360 buckets."""

DEFAULT_RANGE = "24h"
QUANTILES = (50, 90, 99)
"""The percentiles every spread holds, in this order."""

KNOWN_ORDER = (
    "completed",
    "failed",
    "tempfail",
    "timed_out",
    "oom_killed",
    "lost",
    "failed_start",
    "spawn_refused",
    "config_error",
    "deferred",
    "reclaimed",
    "replaced",
    "skipped_overlap",
    "missed",
    "coalesced",
)
"""The order stacked bars draw the outcomes in (the shared vocabulary's); any other label
follows, by name."""


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
        # Divided, then truncated: what the SQL stores compute (CAST, floor), to the bit.
        return min(self.count - 1, int((at - self.start) / self.step))

    def part(self, first: int, count: int) -> Window:
        """The ``count`` buckets from bucket ``first`` as a window of their own."""
        return Window(start=self.start + self.step * first, step=self.step, count=count)


def window(range_name: str, now: float) -> Window:
    """The window of ``range_name`` ending with the bucket that holds ``now``
    (KeyError for an unknown range name)."""
    span, step = RANGES[range_name]
    count = int(span // step)
    last = math.floor(now / step) * step
    return Window(start=last - step * (count - 1), step=step, count=count)


def order_outcomes(seen: Iterable[str]) -> list[str]:
    """``seen`` labels in drawing order: the known ones first, then the others by name."""
    found = set(seen)
    known = [o for o in KNOWN_ORDER if o in found]
    return known + sorted(found - set(KNOWN_ORDER))


def rank(n: int, q: int) -> int:
    """The nearest rank (1-based) of the ``q``-th percentile among ``n`` values."""
    return max(1, (q * n + 99) // 100)


def percentile(values: Sequence[float], q: int) -> float | None:
    """The nearest-rank ``q``-th percentile of ``values`` (None when there are none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(rank(len(ordered), q), len(ordered)) - 1]


@dataclass(frozen=True)
class Spread:
    """How many values one bucket has of a measure, and their :data:`QUANTILES`."""

    count: int = 0
    values: tuple[float | None, ...] = (None,) * len(QUANTILES)

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of ``values``."""
        ordered = sorted(values)
        n = len(ordered)
        if not n:
            return cls()
        return cls(n, tuple(ordered[rank(n, q) - 1] for q in QUANTILES))

    def at(self, q: int) -> float | None:
        """The ``q``-th percentile (one of :data:`QUANTILES`)."""
        return self.values[QUANTILES.index(q)]


@dataclass(frozen=True)
class Bucket:
    """What one interval holds: counts by label, and spreads by measure (``wait``, ``run``,
    ``lag``: see the store that answers)."""

    counts: Mapping[str, int] = field(default_factory=dict)
    spreads: Mapping[str, Spread] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """The sum of the counts."""
        return sum(self.counts.values())


Sample = tuple[float, str, tuple[float | None, ...]]
"""One counted row: when it counts, its label, and its value of each measure (None: none)."""


class Tally:
    """Counts and values per bucket of a window, filled one row at a time (a range read streams
    its rows in), then read as :class:`Bucket` records."""

    def __init__(self, win: Window, measures: Sequence[str]) -> None:
        self.win = win
        self.counts: list[dict[str, int]] = [{} for _ in range(win.count)]
        self.values: dict[str, list[list[float]]] = {
            name: [[] for _ in range(win.count)] for name in measures
        }

    def count(self, i: int, label: str, n: int = 1) -> None:
        """``n`` more of ``label`` in bucket ``i``."""
        counts = self.counts[i]
        counts[label] = counts.get(label, 0) + n

    def measure(self, name: str, i: int, value: float) -> None:
        """One value of measure ``name`` in bucket ``i``."""
        self.values[name][i].append(value)

    def buckets(self) -> list[Bucket]:
        """Every bucket's counts and spreads."""
        return [
            Bucket(counts, {name: Spread.of(per[i]) for name, per in self.values.items()})
            for i, counts in enumerate(self.counts)
        ]


def tally(win: Window, measures: Sequence[str], samples: Iterable[Sample]) -> list[Bucket]:
    """Per bucket of ``win``, the ``samples`` in it counted by label and spread by measure
    (samples outside the window are left out)."""
    counted = Tally(win, measures)
    for at, label, values in samples:
        i = win.index(at)
        if i is None:
            continue
        counted.count(i, label)
        for name, value in zip(measures, values, strict=True):
            if value is not None:
                counted.measure(name, i, value)
    return counted.buckets()


def bucket_of(measures: Sequence[str], samples: Iterable[Sample]) -> Bucket:
    """All of ``samples`` as one bucket (what :func:`tally` makes of a bucket's samples)."""
    counts: dict[str, int] = {}
    values: list[list[float]] = [[] for _ in measures]
    for _, label, measured in samples:
        counts[label] = counts.get(label, 0) + 1
        for mine, value in zip(values, measured, strict=True):
            if value is not None:
                mine.append(value)
    return Bucket(counts, {name: Spread.of(values[m]) for m, name in enumerate(measures)})


def buckets_of(
    win: Window,
    labelled: Iterable[tuple[float, str]],
    measured: Mapping[str, Iterable[tuple[float, float]]],
) -> list[Bucket]:
    """Per bucket, the ``(at, label)`` rows counted and each measure's ``(at, value)`` rows
    spread (rows outside the window are left out)."""
    tally = Tally(win, list(measured))
    for at, label in labelled:
        i = win.index(at)
        if i is not None:
            tally.count(i, label)
    for name, rows in measured.items():
        for at, value in rows:
            i = win.index(at)
            if i is not None:
                tally.measure(name, i, value)
    return tally.buckets()


def clamp(bucket: Any, win: Window) -> int:
    """A bucket number computed in SQL, kept inside the window (a time a hair below the
    window's end may round up to the bucket after the last)."""
    return max(0, min(win.count - 1, int(bucket)))


Flows = dict[tuple[str, str], int]
"""How many status changes one bucket holds, by (from, to); ``""`` is "no status" (a card that
did not exist yet)."""


def depth(
    current: Mapping[str, int], flows: Sequence[Flows], statuses: Sequence[str]
) -> dict[str, list[int]]:
    """For each of ``statuses``, how many were in it at the end of each bucket, counted back
    from ``current`` (the counts now, at the end of the last bucket) by undoing each later
    bucket's changes: a change from A to B after the end of bucket i means one more in A and
    one fewer in B at that end."""
    levels = {s: current.get(s, 0) for s in statuses}
    series: dict[str, list[int]] = {s: [0] * len(flows) for s in statuses}
    for i in range(len(flows) - 1, -1, -1):
        for s in statuses:
            series[s][i] = levels[s]
        for (before, after), n in flows[i].items():
            if before in levels:
                levels[before] += n
            if after in levels:
                levels[after] -= n
    return series
