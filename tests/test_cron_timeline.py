"""Fire instants in real time: cronie's DST rule in a northern and a southern hemisphere zone (plus
a 30-minute shift), fire keys across DST, and epoch-anchored intervals.

The expected tables were worked out by hand from the zones' published transitions:

* Europe/Berlin 2026: clocks forward Sun 29 Mar 02:00 CET -> 03:00 CEST; back Sun 25 Oct
  03:00 CEST -> 02:00 CET.
* Australia/Sydney 2026: back Sun 5 Apr 03:00 AEDT -> 02:00 AEST; forward Sun 4 Oct 02:00 AEST ->
  03:00 AEDT.
* America/New_York 2026: forward Sun 8 Mar 02:00 EST -> 03:00 EDT; back Sun 1 Nov 02:00 EDT ->
  01:00 EST.
* Australia/Lord_Howe 2026: forward Sun 4 Oct 02:00 -> 02:30 (+10:30 -> +11:00).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from dispatcher.cron.crontab import parse
from dispatcher.cron.timeline import CronSchedule, IntervalSchedule, fire_key


def _instant(text: str, zone: str) -> float:
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zoneinfo.ZoneInfo(zone))
    return moment.timestamp()


def _iso(at: float, zone: str) -> str:
    return dt.datetime.fromtimestamp(at, zoneinfo.ZoneInfo(zone)).isoformat()


def _fires(expr: str, zone: str, start: str, count: int) -> list[tuple[str, str, int, str]]:
    """(instant, nominal wall, fold, flag) for the next ``count`` occurrences."""
    schedule = CronSchedule(parse(expr), zoneinfo.ZoneInfo(zone))
    out = []
    for occ in schedule.occurrences(_instant(start, zone)):
        if len(out) == count:
            break
        flag = "coalesced" if occ.coalesced else ("gap" if occ.gap else "")
        out.append((_iso(occ.at, zone), occ.wall.isoformat(), occ.fold, flag))
    return out


DST_CASES = [
    # -- Europe/Berlin, clocks forward: fixed-time fire in the gap runs at the gap's end.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2026-03-28T12:00",
        [
            ("2026-03-29T03:00:00+02:00", "2026-03-29T02:30:00", 0, "gap"),
            ("2026-03-30T02:30:00+02:00", "2026-03-30T02:30:00", 0, ""),
        ],
    ),
    # Several fires of one job in the same gap: the first runs, the others are coalesced.
    (
        "0,30 2 * * *",
        "Europe/Berlin",
        "2026-03-28T12:00",
        [
            ("2026-03-29T03:00:00+02:00", "2026-03-29T02:00:00", 0, "gap"),
            ("2026-03-29T03:00:00+02:00", "2026-03-29T02:30:00", 0, "coalesced"),
            ("2026-03-30T02:00:00+02:00", "2026-03-30T02:00:00", 0, ""),
        ],
    ),
    # Wildcard jobs have no fires in the gap.
    (
        "*/30 * * * *",
        "Europe/Berlin",
        "2026-03-29T01:00",
        [
            ("2026-03-29T01:30:00+01:00", "2026-03-29T01:30:00", 0, ""),
            ("2026-03-29T03:00:00+02:00", "2026-03-29T03:00:00", 0, ""),
            ("2026-03-29T03:30:00+02:00", "2026-03-29T03:30:00", 0, ""),
        ],
    ),
    (
        "*/30 2 * * *",
        "Europe/Berlin",
        "2026-03-29T00:00",
        [
            ("2026-03-30T02:00:00+02:00", "2026-03-30T02:00:00", 0, ""),
            ("2026-03-30T02:30:00+02:00", "2026-03-30T02:30:00", 0, ""),
        ],
    ),
    # -- Europe/Berlin, clocks back: fixed-time only at the first occurrence.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2026-10-24T12:00",
        [
            ("2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00", 0, ""),
            ("2026-10-26T02:30:00+01:00", "2026-10-26T02:30:00", 0, ""),
        ],
    ),
    # Wildcard: every matching instant of real time, both passes.
    (
        "15 * * * *",
        "Europe/Berlin",
        "2026-10-25T01:00",
        [
            ("2026-10-25T01:15:00+02:00", "2026-10-25T01:15:00", 0, ""),
            ("2026-10-25T02:15:00+02:00", "2026-10-25T02:15:00", 0, ""),
            ("2026-10-25T02:15:00+01:00", "2026-10-25T02:15:00", 1, ""),
            ("2026-10-25T03:15:00+01:00", "2026-10-25T03:15:00", 0, ""),
        ],
    ),
    (
        "*/30 2 * * *",
        "Europe/Berlin",
        "2026-10-25T00:00",
        [
            ("2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00", 0, ""),
            ("2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00", 0, ""),
            ("2026-10-25T02:00:00+01:00", "2026-10-25T02:00:00", 1, ""),
            ("2026-10-25T02:30:00+01:00", "2026-10-25T02:30:00", 1, ""),
            ("2026-10-26T02:00:00+01:00", "2026-10-26T02:00:00", 0, ""),
        ],
    ),
    # Starting inside the first pass of the repeated hour: the second pass is still ahead.
    (
        "*/30 2 * * *",
        "Europe/Berlin",
        "2026-10-25T02:10:00+02:00",
        [
            ("2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00", 0, ""),
            ("2026-10-25T02:00:00+01:00", "2026-10-25T02:00:00", 1, ""),
            ("2026-10-25T02:30:00+01:00", "2026-10-25T02:30:00", 1, ""),
        ],
    ),
    # Starting inside the second pass: only what is left of it.
    (
        "*/30 2 * * *",
        "Europe/Berlin",
        "2026-10-25T02:10:00+01:00",
        [
            ("2026-10-25T02:30:00+01:00", "2026-10-25T02:30:00", 1, ""),
            ("2026-10-26T02:00:00+01:00", "2026-10-26T02:00:00", 0, ""),
        ],
    ),
    # A fixed-time job starting in the second pass does not fire its repeat.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2026-10-25T02:10:00+01:00",
        [("2026-10-26T02:30:00+01:00", "2026-10-26T02:30:00", 0, "")],
    ),
    # -- Australia/Sydney (southern hemisphere): back in April, forward in October.
    (
        "30 2 * * *",
        "Australia/Sydney",
        "2026-04-04T12:00",
        [
            ("2026-04-05T02:30:00+11:00", "2026-04-05T02:30:00", 0, ""),
            ("2026-04-06T02:30:00+10:00", "2026-04-06T02:30:00", 0, ""),
        ],
    ),
    (
        "*/30 2 * * *",
        "Australia/Sydney",
        "2026-04-05T00:00",
        [
            ("2026-04-05T02:00:00+11:00", "2026-04-05T02:00:00", 0, ""),
            ("2026-04-05T02:30:00+11:00", "2026-04-05T02:30:00", 0, ""),
            ("2026-04-05T02:00:00+10:00", "2026-04-05T02:00:00", 1, ""),
            ("2026-04-05T02:30:00+10:00", "2026-04-05T02:30:00", 1, ""),
        ],
    ),
    (
        "30 2 * * *",
        "Australia/Sydney",
        "2026-10-03T12:00",
        [
            ("2026-10-04T03:00:00+11:00", "2026-10-04T02:30:00", 0, "gap"),
            ("2026-10-05T02:30:00+11:00", "2026-10-05T02:30:00", 0, ""),
        ],
    ),
    (
        "10 * * * *",
        "Australia/Sydney",
        "2026-10-04T01:00",
        [
            ("2026-10-04T01:10:00+10:00", "2026-10-04T01:10:00", 0, ""),
            ("2026-10-04T03:10:00+11:00", "2026-10-04T03:10:00", 0, ""),
        ],
    ),
    # -- America/New_York.
    (
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T12:00",
        [
            ("2026-03-08T03:00:00-04:00", "2026-03-08T02:30:00", 0, "gap"),
            ("2026-03-09T02:30:00-04:00", "2026-03-09T02:30:00", 0, ""),
        ],
    ),
    (
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00",
        [
            ("2026-11-01T01:30:00-04:00", "2026-11-01T01:30:00", 0, ""),
            ("2026-11-02T01:30:00-05:00", "2026-11-02T01:30:00", 0, ""),
        ],
    ),
    # -- A 30-minute shift (Lord Howe): the gap is 02:00-02:30.
    (
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T12:00",
        [
            ("2026-10-04T02:30:00+11:00", "2026-10-04T02:15:00", 0, "gap"),
            ("2026-10-05T02:15:00+11:00", "2026-10-05T02:15:00", 0, ""),
        ],
    ),
    (
        "*/20 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-04T00:00",
        [
            ("2026-10-04T02:40:00+11:00", "2026-10-04T02:40:00", 0, ""),
            ("2026-10-05T02:00:00+11:00", "2026-10-05T02:00:00", 0, ""),
        ],
    ),
]


@pytest.mark.parametrize(("expr", "zone", "start", "expected"), DST_CASES)
def test_dst_rule(expr: str, zone: str, start: str, expected: list) -> None:
    assert _fires(expr, zone, start, len(expected)) == expected


def test_fire_keys_are_unique_across_a_fall_back_day() -> None:
    schedule = CronSchedule(parse("*/10 * * * *"), zoneinfo.ZoneInfo("Europe/Berlin"))
    start = _instant("2026-10-24T23:00", "Europe/Berlin")
    occurrences = list(schedule.between(start, start + 30 * 3600))
    keys = [fire_key("j", o.wall, o.fold) for o in occurrences]
    assert len(keys) == len(set(keys))
    # The repeated hour 02:00-02:59 fires six extra times, keyed with fold 1.
    assert sum(o.fold for o in occurrences) == 6
    assert "j@2026-10-25T02:00:00,fold=1" in keys
    assert "j@2026-10-25T02:00:00" in keys
    instants = [o.at for o in occurrences]
    assert instants == sorted(instants)
    assert len(set(instants)) == len(instants)


def test_next_instants_show_each_instant_once() -> None:
    # 02:00 falls in the gap and runs at 03:00, the same instant as the regular 03:00 fire.
    schedule = CronSchedule(parse("0 2,3 * * *"), zoneinfo.ZoneInfo("Europe/Berlin"))
    found = schedule.next_instants(_instant("2026-03-29T00:00", "Europe/Berlin"), 3)
    assert [_iso(a, "Europe/Berlin") for a in found] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:00:00+02:00",
        "2026-03-30T03:00:00+02:00",
    ]
    coalescing = CronSchedule(parse("0,30 2 * * *"), zoneinfo.ZoneInfo("Europe/Berlin"))
    found = coalescing.next_instants(_instant("2026-03-29T00:00", "Europe/Berlin"), 2)
    assert [_iso(a, "Europe/Berlin") for a in found] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:00:00+02:00",
    ]


def test_occurrences_are_strictly_after_the_start() -> None:
    schedule = CronSchedule(parse("0 * * * *"), zoneinfo.ZoneInfo("UTC"))
    start = _instant("2026-01-01T10:00:00+00:00", "UTC")
    first = next(iter(schedule.occurrences(start)))
    assert _iso(first.at, "UTC") == "2026-01-01T11:00:00+00:00"


@pytest.mark.parametrize("every", [60.0, 420.0, 3600.0, 86400.0, 7.5])
def test_interval_fires_are_anchored_to_the_epoch(every: float) -> None:
    zone = zoneinfo.ZoneInfo("Europe/Berlin")
    for start in (1_800_000_000.0, 1_800_000_123.4, 1_774_745_000.0):
        a = list(_take(IntervalSchedule(every, zone).occurrences(start), 5))
        # A "restart" a little later sees the same grid.
        b = list(_take(IntervalSchedule(every, zone).occurrences(start + every / 3), 4))
        for occ in a:
            assert occ.at % every == pytest.approx(0.0, abs=1e-6) or occ.at % every == (
                pytest.approx(every, abs=1e-6)
            )
            assert occ.at > start
        assert a[0].at - start <= every
        assert {o.at for o in b} <= {o.at for o in a} | {a[-1].at + every}


def test_interval_offset_shifts_the_phase() -> None:
    schedule = IntervalSchedule(60.0, zoneinfo.ZoneInfo("UTC"), offset=17.0)
    found = [o.at for o in _take(schedule.occurrences(1_800_000_000.0), 3)]
    assert [a % 60 for a in found] == [17.0, 17.0, 17.0]
    assert found[1] - found[0] == 60.0


def test_interval_keys_across_fall_back_use_the_fold() -> None:
    zone = zoneinfo.ZoneInfo("Europe/Berlin")
    start = _instant("2026-10-25T01:50:00+02:00", "Europe/Berlin")
    occurrences = list(_take(IntervalSchedule(1800.0, zone).occurrences(start), 4))
    keys = [fire_key("i", o.wall, o.fold) for o in occurrences]
    assert keys == [
        "i@2026-10-25T02:00:00",
        "i@2026-10-25T02:30:00",
        "i@2026-10-25T02:00:00,fold=1",
        "i@2026-10-25T02:30:00,fold=1",
    ]


def _take(iterator, count):
    for _, item in zip(range(count), iterator, strict=False):
        yield item
