"""Crontab parsing and matching (Vixie/cronie semantics), cross-checked against two references:
an independent brute-force matcher written here from the crontab(5) rules, and croniter for the
expressions where croniter agrees with cronie."""

from __future__ import annotations

import datetime as dt
import itertools
import random
import re

import pytest
from croniter import croniter

from dispatcher.cron.crontab import parse
from dispatcher.cron.errors import CronExpressionError

# -- an independent reference ----------------------------------------------------------------
# Written from crontab(5) without looking at the implementation: expand every field to a set by
# brute force, then walk minute by minute.

_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
_MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


def _ref_value(token: str, index: int) -> int:
    token = token.lower()
    if index == 3 and token in _MONTHS:
        return _MONTHS.index(token) + 1
    if index == 4 and token in _DAYS:
        return _DAYS.index(token)
    return int(token)


def _ref_field(text: str, index: int) -> set[int]:
    low, high = _BOUNDS[index]
    out: set[int] = set()
    for item in text.split(","):
        match = re.fullmatch(r"(\*|\w+(?:-\w+)?)(?:/(\d+))?", item)
        assert match, item
        span, step = match.group(1), int(match.group(2) or 1)
        if span == "*":
            start, stop = low, high
        elif "-" in span:
            a, b = span.split("-")
            start, stop = _ref_value(a, index), _ref_value(b, index)
        else:
            start = stop = _ref_value(span, index)
        value = start
        while value <= stop:
            out.add(value)
            value += step
    if index == 4 and 7 in out:
        out.discard(7)
        out.add(0)
    return out


def reference_matcher(expr: str):
    """Day and minute predicates on naive datetimes implementing crontab(5) literally."""
    fields = _MACROS.get(expr, expr).split()
    sets = [_ref_field(text, i) for i, text in enumerate(fields)]
    dom_star, dow_star = fields[2][0] == "*", fields[4][0] == "*"

    def day_ok(day: dt.date) -> bool:
        if day.month not in sets[3]:
            return False
        dom_ok = day.day in sets[2]
        dow_ok = day.isoweekday() % 7 in sets[4]
        if dom_star or dow_star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok

    def minute_ok(moment: dt.datetime) -> bool:
        return moment.minute in sets[0] and moment.hour in sets[1]

    return day_ok, minute_ok


def reference_next(expr: str, start: dt.datetime, count: int) -> list[dt.datetime]:
    day_ok, minute_ok = reference_matcher(expr)
    found: list[dt.datetime] = []
    first = start.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    day = first.date()
    for _ in range(13 * 366):
        if day_ok(day):
            midnight = dt.datetime.combine(day, dt.time())
            for minute in range(24 * 60):
                moment = midnight + dt.timedelta(minutes=minute)
                if moment >= first and minute_ok(moment):
                    found.append(moment)
                    if len(found) == count:
                        return found
        day += dt.timedelta(days=1)
    return found


def ours_next(expr: str, start: dt.datetime, count: int) -> list[dt.datetime]:
    parsed = parse(expr)
    found = []
    moment = start.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    for _ in range(count):
        hit = parsed.next_match(moment)
        assert hit is not None
        found.append(hit)
        moment = hit + dt.timedelta(minutes=1)
    return found


EXPRESSIONS = [
    "* * * * *",
    "*/15 * * * *",
    "5-59/15 * * * *",
    "0 1-5/2 * * *",
    "30 4 1,15 * 5",  # both day fields restricted: OR
    "0 0 * * 7",  # 7 is Sunday
    "0 0 * * 0",
    "0 12 * * mon-fri",
    "0 12 * * SUN,sat",
    "15 10 * JAN-Mar *",
    "0 0 13 * fri",  # Friday OR the 13th
    "0 0 */2 * mon",  # '*/2' counts as starred: odd days AND Monday
    "0 0 1 * */3",  # starred day-of-week: the 1st AND a weekday in {0,3,6}
    "0 0 29 2 *",  # leap days only
    "59 23 31 * *",
    "0 9-17/4 * * 1-5",
    "0,30 * 1 1 *",
    "0 0 * * 5-7",
    "*/7 */5 * * *",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "@yearly",
]

STARTS = [
    dt.datetime(2024, 1, 1, 0, 0),
    dt.datetime(2024, 2, 27, 23, 58),
    dt.datetime(2025, 12, 31, 23, 59, 30),
    dt.datetime(2026, 6, 15, 12, 7),
]


@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_next_matches_agree_with_the_brute_force_reference(expr: str) -> None:
    count = 3 if expr == "0 0 29 2 *" else 12
    for start in STARTS:
        assert ours_next(expr, start, count) == reference_next(expr, start, count), (expr, start)


@pytest.mark.parametrize(
    "expr",
    # croniter agrees with cronie on these (it differs on the '*/2' starred-field quirk).
    [e for e in EXPRESSIONS if e not in ("0 0 */2 * mon", "0 0 1 * */3")],
)
def test_next_matches_agree_with_croniter(expr: str) -> None:
    start = dt.datetime(2024, 3, 1, 10, 3)
    it = croniter(expr, start)
    expected = [it.get_next(dt.datetime) for _ in range(8)]
    assert ours_next(expr, start, 8) == expected


def test_matches_is_consistent_with_next_match() -> None:
    parsed = parse("*/20 8-10 1,15 * mon")
    start = dt.datetime(2024, 4, 1)
    hits = set(ours_next("*/20 8-10 1,15 * mon", start - dt.timedelta(minutes=1), 40))
    moment = start
    while moment <= max(hits):
        assert parsed.matches(moment) == (moment in hits), moment
        moment += dt.timedelta(minutes=1)


@pytest.mark.parametrize(
    ("expr", "minutes", "hours", "weekdays"),
    [
        ("*/15 * * * *", (0, 15, 30, 45), tuple(range(24)), frozenset(range(7))),
        ("5-59/15 * * * *", (5, 20, 35, 50), tuple(range(24)), frozenset(range(7))),
        ("0 1-5/2 * * *", (0,), (1, 3, 5), frozenset(range(7))),
        ("0 0 * * 7", (0,), (0,), frozenset({0})),
        ("0 0 * * 0,7", (0,), (0,), frozenset({0})),
        ("0 0 * * Mon-WED", (0,), (0,), frozenset({1, 2, 3})),
        ("0 0 * * fri-7", (0,), (0,), frozenset({5, 6, 0})),
    ],
)
def test_field_sets(expr: str, minutes, hours, weekdays) -> None:
    parsed = parse(expr)
    assert parsed.minutes == minutes
    assert parsed.hours == hours
    assert parsed.weekdays == weekdays


@pytest.mark.parametrize(
    ("expr", "wildcard"),
    [
        ("30 2 * * *", False),
        ("0 */2 * * *", True),
        ("* 3 * * *", True),
        ("0,30 1-3 * * *", False),
        ("@hourly", True),
        ("@daily", False),
    ],
)
def test_wildcard_class_follows_the_first_character(expr: str, wildcard: bool) -> None:
    assert parse(expr).wildcard is wildcard


def test_macros_equal_their_expansions() -> None:
    for macro, text in [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ]:
        a, b = parse(macro), parse(text)
        assert (a.minutes, a.hours, a.days, a.months, a.weekdays) == (
            b.minutes,
            b.hours,
            b.days,
            b.months,
            b.weekdays,
        )
        assert (a.dom_star, a.dow_star, a.wildcard) == (b.dom_star, b.dow_star, b.wildcard)


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("", "empty"),
        ("* * * *", "expected 5 fields"),
        ("* * * * * *", "expected 5 fields"),
        ("60 * * * *", "60 is out of range 0-59"),
        ("* 24 * * *", "24 is out of range 0-23"),
        ("* * 0 * *", "0 is out of range 1-31"),
        ("* * 32 * *", "32 is out of range 1-31"),
        ("* * * 13 *", "13 is out of range 1-12"),
        ("* * * * 8", "8 is out of range 0-7"),
        ("*/0 * * * *", "step 0"),
        ("*/60 * * * *", "step 60 is out of range"),
        ("5/15 * * * *", "a step needs a range"),
        ("10-5 * * * *", "reversed"),
        ("1,,2 * * * *", "empty list item"),
        ("mon * * * *", "'mon' is not a valid value"),
        ("* * * * funday", "'funday' is not a valid value"),
        ("* * * * monday", "'monday' is not a valid value"),
        ("* * * foo *", "'foo' is not a valid value"),
        ("*/x * * * *", "step 'x' is not a number"),
        ("1~5 * * * *", "random"),
        ("0 0 30 2 *", "never"),
        ("0 0 31 4,6,9,11 *", "never"),
        ("@reboot", "@reboot is not supported"),
        ("@every 5m", "every:"),
        ("@often", "unknown macro"),
    ],
)
def test_invalid_expressions_are_one_line_errors(expr: str, fragment: str) -> None:
    with pytest.raises(CronExpressionError) as info:
        parse(expr)
    message = info.value.message
    assert fragment in message
    assert "\n" not in message
    assert info.value.exit_code == 2


def test_both_day_fields_restricted_is_never_impossible() -> None:
    # Feb 30 never exists, but with a restricted weekday the OR rule still fires on Mondays.
    hits = ours_next("0 0 30 2 mon", dt.datetime(2024, 1, 1), 3)
    assert all(h.month == 2 and h.weekday() == 0 for h in hits)


def test_every_expression_in_a_small_grid_matches_the_reference() -> None:
    # A combinatorial sweep over field shapes, all checked against the reference.
    shapes = {
        "minute": ["0", "*/20", "10-40/15", "59"],
        "hour": ["*", "0", "6-18/6"],
        "dom": ["*", "1", "*/10", "15-20"],
        "month": ["*", "2", "jun-aug"],
        "dow": ["*", "0", "7", "mon-fri/2", "*/2"],
    }
    start = dt.datetime(2024, 1, 30, 22, 0)
    combos = list(itertools.product(*shapes.values()))
    for combo in random.Random(7).sample(combos, 200):
        expr = " ".join(combo)
        assert ours_next(expr, start, 4) == reference_next(expr, start, 4), expr
