"""When a job fires in real time: crontab expressions in a zone with cronie's DST rule, and
epoch-anchored intervals.

A schedule yields :class:`Occurrence` records in order of the instant they are due. Each carries
its *nominal* local wall time and fold, which make the fire key (see :func:`fire_key`).

cronie's DST rule, per job (a job is *wildcard* when its minute or hour field starts with ``*``,
else *fixed-time*):

* clocks go forward (a wall-time interval does not exist): a fixed-time fire whose wall time falls
  in the gap is due at the first instant after the gap; when several fires of one job fall in the
  same gap only the first runs and the others are marked ``coalesced``. Wildcard jobs have no fires
  in the gap.
* clocks go back (a wall-time interval happens twice): a fixed-time fire is due only at the first
  occurrence of its wall time (fold 0); a wildcard job fires at every matching instant of real
  time, so the repeated wall times fire twice (fold 0, then fold 1).

Interval schedules (``every``) ignore wall time: fires are due at ``offset + k * every`` seconds
after the Unix epoch, so they stay put across restarts and DST; their wall time and fold are only
used for the fire key and display.

Time is bounded: a schedule computes nothing before :data:`EARLIEST` and ends (its iterator
stops) once the next fire would fall after :data:`LATEST` or, for crontab schedules, on a wall
day after :data:`~dispatcher.cron.crontab.LAST_DAY`. Both bounds sit a day inside what
:mod:`datetime` can represent, so no zone offset can push a computation out of range; a sparse
schedule near year 9999 yields the fires that exist and then stops.
"""

from __future__ import annotations

import abc
import datetime as dt
import heapq
import math
import re
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass

from dispatcher.cron.crontab import CronExpr
from scope.foundation.errors import Invalid
from scope.foundation.text import quote

_UTC = dt.UTC
_MINUTE = dt.timedelta(minutes=1)

EARLIEST = dt.datetime(1, 1, 2, tzinfo=_UTC).timestamp()
"""The first instant a schedule computes from (epoch seconds; 0001-01-02T00:00Z)."""
LATEST = dt.datetime(9999, 12, 30, tzinfo=_UTC).timestamp()
"""The last instant a schedule starts from or an interval fires at (9999-12-30T00:00Z)."""
# Longest DST shift on record is 2 h (Antarctica/Troll); look a little further.
_SHIFT_WINDOW = 3 * 3600


@dataclass(frozen=True, kw_only=True)
class Occurrence:
    """One fire of a schedule."""

    wall: dt.datetime
    """Nominal local wall time (naive). For a DST-gap fire it is a wall time that never existed."""
    fold: int
    """0 for the first (or only) occurrence of ``wall``, 1 for the repeat after clocks went back."""
    at: float
    """Epoch seconds at which the fire is due."""
    coalesced: bool = False
    """A DST-gap fire folded into an earlier fire of the same gap (recorded, never run)."""
    gap: bool = False
    """``wall`` fell in a DST gap; ``at`` is the first instant after the gap."""


def fire_key(job_id: str, wall: dt.datetime, fold: int) -> str:
    """The ledger key of a scheduled fire: ``job@2026-03-29T02:30:00`` (``,fold=1`` appended for
    the repeat of a wall time after clocks went back)."""
    return key_of(job_id, format_wall(wall), fold)


def key_of(job_id: str, wall_text: str, fold: int) -> str:
    """:func:`fire_key` from an already formatted wall time."""
    return f"{job_id}@{wall_text},fold=1" if fold else f"{job_id}@{wall_text}"


_KEY = re.compile(
    r"(?P<job>[a-z0-9][a-z0-9_-]*)@(?P<wall>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
    r"(?:\.[0-9]{3})?)(?P<fold>,fold=1)?"
)


def parse_fire_key(key: str) -> tuple[str, dt.datetime, int]:
    """``(job_id, wall, fold)`` of a scheduled fire's key (the inverse of :func:`fire_key`, for
    the ``DISPATCH_FIRE_KEY`` a worker sees); :class:`Invalid` for anything else, a manual
    run's key (``job@run:...``) included."""
    match = _KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        raise Invalid(
            f"invalid fire key {quote(key)}; scheduled fires look like "
            "job@2026-03-29T02:30:00 (',fold=1' for the repeat after clocks went back)"
        )
    try:
        wall = dt.datetime.fromisoformat(match.group("wall"))
    except ValueError as err:
        raise Invalid(f"invalid fire key {quote(key)}: {err}") from None
    return match.group("job"), wall, 1 if match.group("fold") else 0


def format_wall(wall: dt.datetime) -> str:
    """A naive wall time as ISO-8601 (whole seconds unless it has a fraction)."""
    return wall.isoformat(timespec="milliseconds" if wall.microsecond else "seconds")


def local_wall(at: float, zone: zoneinfo.ZoneInfo) -> tuple[dt.datetime, int]:
    """The naive wall time and fold of the instant ``at`` in ``zone``."""
    moment = dt.datetime.fromtimestamp(at, zone)
    return moment.replace(tzinfo=None, fold=0), moment.fold


class Schedule(abc.ABC):
    """Fire times of one job in its zone."""

    zone: zoneinfo.ZoneInfo

    @abc.abstractmethod
    def occurrences(self, after: float) -> Iterator[Occurrence]:
        """Every occurrence due strictly after ``after``, in order of ``at``; it ends only at
        the bounds of computable time (see the module docstring)."""

    def between(self, after: float, until: float) -> Iterator[Occurrence]:
        """Occurrences with ``after < at <= until``."""
        for occurrence in self.occurrences(after):
            if occurrence.at > until:
                return
            yield occurrence

    def next_instants(self, after: float, count: int) -> list[float]:
        """The next ``count`` distinct instants at which something runs (coalesced fires and
        duplicate instants are shown once); fewer when the schedule reaches the end of
        computable time first."""
        found: list[float] = []
        for occurrence in self.occurrences(after):
            if len(found) >= count:
                break
            if occurrence.coalesced or (found and found[-1] == occurrence.at):
                continue
            found.append(occurrence.at)
        return found


class CronSchedule(Schedule):
    """A crontab expression evaluated in ``zone`` with cronie's DST rule."""

    def __init__(self, expr: CronExpr, zone: zoneinfo.ZoneInfo) -> None:
        self.expr = expr
        self.zone = zone

    def occurrences(self, after: float) -> Iterator[Occurrence]:
        after = max(after, EARLIEST)
        if after > LATEST:
            return
        wall, _ = local_wall(after, self.zone)
        wall = wall.replace(second=0, microsecond=0)
        if _offset(after, self.zone) != _offset(after + _SHIFT_WINDOW, self.zone):
            # A transition is near: repeats of earlier wall times may still be ahead in real
            # time, so start the wall-clock walk before the current wall time.
            wall -= dt.timedelta(seconds=_SHIFT_WINDOW)
        repeats: list[tuple[float, dt.datetime]] = []  # fold-1 fires waiting for their turn
        last_gap_at: float | None = None
        wildcard = self.expr.wildcard
        while True:
            found = self.expr.next_match(wall)
            if found is None:  # the end of computable time (parse() rejects never-matching)
                break
            wall = found + _MINUTE
            kind, first, second = _classify(found, self.zone)
            primary: Occurrence | None = None
            if kind == "unique":
                primary = Occurrence(wall=found, fold=0, at=first)
            elif kind == "repeated":
                primary = Occurrence(wall=found, fold=0, at=first)
                if wildcard:
                    heapq.heappush(repeats, (second, found))
            elif not wildcard:
                primary = Occurrence(
                    wall=found, fold=0, at=first, gap=True, coalesced=last_gap_at == first
                )
                last_gap_at = first
            if primary is None:
                continue
            while repeats and repeats[0][0] < primary.at:
                at, rwall = heapq.heappop(repeats)
                if at > after:
                    yield Occurrence(wall=rwall, fold=1, at=at)
            if primary.at > after:
                yield primary
        for at, rwall in sorted(repeats):
            if at > after:
                yield Occurrence(wall=rwall, fold=1, at=at)


class IntervalSchedule(Schedule):
    """Fires at ``offset + k * every`` seconds after the Unix epoch (stable across restarts)."""

    def __init__(self, every: float, zone: zoneinfo.ZoneInfo, offset: float = 0.0) -> None:
        if every <= 0:
            raise ValueError("every must be positive")
        self.every = every
        self.offset = offset % every
        self.zone = zone

    def occurrences(self, after: float) -> Iterator[Occurrence]:
        return self.between(after, LATEST)

    def between(self, after: float, until: float) -> Iterator[Occurrence]:
        # Arithmetic bounds: no occurrence past ``until`` is built just to be thrown away.
        after, until = max(after, EARLIEST), min(until, LATEST)
        k = math.floor((after - self.offset) / self.every) + 1
        while True:
            at = self.offset + k * self.every
            k += 1
            if at <= after:
                continue
            if at > until:
                return
            wall, fold = local_wall(at, self.zone)
            yield Occurrence(wall=wall, fold=fold, at=at)


def _offset(at: float, zone: zoneinfo.ZoneInfo) -> dt.timedelta | None:
    return dt.datetime.fromtimestamp(at, zone).utcoffset()


def _classify(wall: dt.datetime, zone: zoneinfo.ZoneInfo) -> tuple[str, float, float]:
    """("unique", at, at), ("repeated", first, second) or ("gap", first instant after, 0)."""
    early = wall.replace(tzinfo=zone, fold=0).timestamp()
    late = wall.replace(tzinfo=zone, fold=1).timestamp()
    if early == late:
        return "unique", early, early
    if dt.datetime.fromtimestamp(early, zone).replace(tzinfo=None) == wall:
        return "repeated", min(early, late), max(early, late)
    return "gap", _transition(min(early, late), max(early, late), zone), 0.0


def _transition(low: float, high: float, zone: zoneinfo.ZoneInfo) -> float:
    """The instant in (low, high] where the offset changes (clocks jump forward)."""
    before = _offset(low, zone)
    lo, hi = math.floor(low), math.ceil(high)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset(mid, zone) == before:
            lo = mid
        else:
            hi = mid
    return float(hi)
