"""The one display rule for times (issue 14): local time with the zone, the date when not
today, relative distances for lists, ISO-8601 for JSON. The clock and the zone are fixed."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from dispatcher.timefmt import TimeView, iso, relative, span, viewer_zone

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
NOW = dt.datetime(2026, 11, 30, 9, 0, 0, tzinfo=BERLIN).timestamp()


def test_today_shows_the_time_and_zone_another_day_the_date() -> None:
    view = TimeView(now=NOW, zone=BERLIN)
    assert view.at(NOW - 5) == "08:59:55 CET"
    assert view.at(NOW - 10 * 3600) == "2026-11-29 23:00:00 CET"
    assert view.at(None) == "-"


def test_a_named_zone_decides_the_day_too() -> None:
    view = TimeView(now=NOW, zone=BERLIN)
    # 09:00 CET is 03:00 in New York: same instant, shown in the job's zone.
    assert view.at(NOW, "America/New_York") == "03:00:00 EST"
    assert view.at(NOW - 4 * 3600, "America/New_York") == "2026-11-29 23:00:00 EST"
    assert view.at(NOW, "UTC") == "08:00:00 UTC"


def test_relative_times_read_like_list_timers() -> None:
    assert relative(NOW + 240, NOW) == "in 4m"
    assert relative(NOW - 3 * 3600, NOW) == "3h ago"
    assert relative(NOW - (3 * 3600 + 12 * 60), NOW) == "3h12m ago"
    assert relative(NOW - 14 * 3600 - 59, NOW) == "14h ago"
    assert relative(NOW + 0.4, NOW) == "now"
    assert [span(s) for s in (0, 45, 270, 86400 * 2 + 5 * 3600)] == ["0s", "45s", "4m30s", "2d5h"]


def test_lists_show_both_and_a_stable_view_only_absolute_times() -> None:
    view = TimeView(now=NOW, zone=BERLIN)
    assert view.both(NOW - 180) == "08:57:00 CET (3m ago)"
    stable = TimeView(now=NOW, zone=BERLIN, stable=True)
    assert stable.both(NOW - 180) == "08:57:00 CET"
    assert stable.ago(NOW - 180) == "08:57:00 CET"


def test_dst_changes_the_zone_name() -> None:
    summer = dt.datetime(2026, 7, 1, 12, 0, tzinfo=BERLIN).timestamp()
    assert TimeView(now=summer, zone=BERLIN).at(summer) == "12:00:00 CEST"


def test_json_stays_iso_with_offset_and_whole_seconds() -> None:
    assert iso(NOW + 0.7, "Europe/Berlin") == "2026-11-30T09:00:00+01:00"
    assert iso(None) is None


@pytest.mark.parametrize(
    ("tz", "expected"),
    [("Europe/Berlin", BERLIN), (":Europe/Berlin", BERLIN), ("/usr/share/zoneinfo/UTC", None)],
)
def test_the_viewers_zone_comes_from_tz(tz: str, expected: object) -> None:
    zone = viewer_zone({"TZ": tz})
    if expected is None:
        assert zone == zoneinfo.ZoneInfo("UTC")
    else:
        assert zone == expected
    assert viewer_zone({}) is None
    assert viewer_zone({"TZ": "Nowhere/Land"}) is None
