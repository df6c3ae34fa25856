"""Generated valid crontab expressions against brute-force references (issue 15, item 2b).

Wall clock: the next fires equal those of the crontab(5) reference in tests/test_cron_crontab.py
(``reference_next``), which expands every field by brute force and walks minute by minute.

Real time in a zone: a second reference walks a grid of real minutes (UTC instants) around DST
transitions, converts each to the zone's wall time and applies cronie's DST rule as
docs/cron.md states it: a wildcard job (minute or hour field starting with ``*``) fires at every
real minute whose wall time matches, so never inside a gap and twice in a repeated hour; a
fixed-time job fires at the first occurrence of a matching wall time only, and its fires whose
wall time falls in a gap run once, at the first instant after the gap.
"""

from __future__ import annotations

import datetime as dt
import functools
import zoneinfo

from hypothesis import given, reject
from hypothesis import strategies as st

from dispatcher.cron.crontab import parse
from dispatcher.cron.errors import CronExpressionError
from dispatcher.cron.timeline import CronSchedule
from tests.support.hostile import crontab_expressions
from tests.test_cron_crontab import ours_next, reference_matcher, reference_next

MINUTE = 60


@st.composite
def expressions(draw: st.DrawFn) -> str:
    """A valid expression (or macro); impossible day/month pairs are skipped."""
    text = draw(crontab_expressions())
    try:
        parse(text)
    except CronExpressionError as err:
        # The only valid-looking input parse() refuses: a day that never occurs in the months.
        assert "never occurs" in err.message, (text, err.message)
        reject()
    return text


# -- wall clock ---------------------------------------------------------------------------------


@given(
    expr=expressions(),
    start=st.datetimes(dt.datetime(1990, 1, 1), dt.datetime(2090, 12, 31)),
)
def test_next_matches_equal_the_crontab_reference(expr: str, start: dt.datetime) -> None:
    count = 3
    assert ours_next(expr, start, count) == reference_next(expr, start, count)


# -- real time in a zone ------------------------------------------------------------------------


@functools.cache
def _transitions(zone_name: str) -> list[float]:
    """Instants where ``zone_name``'s offset changes, 2000-2037 (scanned daily, then hourly:
    transitions in these zones fall on whole hours)."""
    zone = zoneinfo.ZoneInfo(zone_name)

    def offset(at: float) -> dt.timedelta | None:
        return dt.datetime.fromtimestamp(at, zone).utcoffset()

    found = []
    day = dt.datetime(2000, 1, 1, tzinfo=dt.UTC).timestamp()
    end = dt.datetime(2038, 1, 1, tzinfo=dt.UTC).timestamp()
    while day < end:
        if offset(day) != offset(day + 86400):
            hour = day
            while offset(hour) == offset(day):
                hour += 3600
            found.append(hour)
        day += 86400
    return found


def grid_reference(expr: str, zone_name: str, after: float, until: float) -> list[float]:
    """Fire instants in (after, until] by walking real minutes (see the module docstring)."""
    zone = zoneinfo.ZoneInfo(zone_name)
    day_ok, minute_ok = reference_matcher(expr.lower() if expr.startswith("@") else expr)
    fields = parse(expr)
    wildcard = fields.minute_star or fields.hour_star

    def wall_of(at: float) -> tuple[dt.datetime, int]:
        moment = dt.datetime.fromtimestamp(at, zone)
        return moment.replace(tzinfo=None, fold=0), moment.fold

    def matches(wall: dt.datetime) -> bool:
        return day_ok(wall.date()) and minute_ok(wall)

    fires = []
    at = (after // MINUTE + 1) * MINUTE
    previous, _ = wall_of(at - MINUTE)
    while at <= until:
        wall, fold = wall_of(at)
        hit = matches(wall) and (wildcard or fold == 0)
        skipped = wall - previous - dt.timedelta(minutes=1)
        if not wildcard and skipped > dt.timedelta(0):
            gap = previous + dt.timedelta(minutes=1)
            while gap < wall and not hit:
                hit = matches(gap)
                gap += dt.timedelta(minutes=1)
        if hit:
            fires.append(at)
        previous = wall
        at += MINUTE
    return fires


def ours_between(expr: str, zone_name: str, after: float, until: float) -> list[float]:
    schedule = CronSchedule(parse(expr), zoneinfo.ZoneInfo(zone_name))
    found: list[float] = []
    for occurrence in schedule.between(after, until):
        if not occurrence.coalesced and (not found or found[-1] != occurrence.at):
            found.append(occurrence.at)
    return found


@st.composite
def windows(draw: st.DrawFn, zone_name: str) -> tuple[float, float]:
    """A two-day window of real time, mostly around one of the zone's DST transitions."""
    transitions = _transitions(zone_name)
    if transitions and draw(st.booleans()):
        center = draw(st.sampled_from(transitions))
    else:
        center = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() + draw(st.integers(0, 10**9))
    after = center - draw(st.integers(0, 36 * 3600)) + draw(st.sampled_from([0, 0.5, 17, 59.9]))
    return after, after + 2 * 86400


@given(
    expr=expressions(),
    zone=st.sampled_from(["America/New_York", "Europe/Berlin"]),
    data=st.data(),
)
def test_fires_in_a_dst_zone_equal_the_minute_grid_reference(
    expr: str, zone: str, data: st.DataObject
) -> None:
    after, until = data.draw(windows(zone), label="window")
    assert ours_between(expr, zone, after, until) == grid_reference(expr, zone, after, until)


@given(expr=expressions(), data=st.data())
def test_fires_in_utc_equal_the_minute_grid_reference(expr: str, data: st.DataObject) -> None:
    after, until = data.draw(windows("UTC"), label="window")
    assert ours_between(expr, "UTC", after, until) == grid_reference(expr, "UTC", after, until)
