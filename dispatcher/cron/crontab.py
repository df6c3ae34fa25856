"""Crontab expressions with Vixie cron / cronie semantics, on naive local wall-clock times.

This module only answers "does this wall-clock minute match?" and "which is the next matching
minute?"; it knows nothing about time zones or DST (see :mod:`dispatcher.cron.timeline`).

Semantics (as cronie's ``entry.c`` implements them):

* five fields: minute 0-59, hour 0-23, day of month 1-31, month 1-12, day of week 0-7 (0 and 7
  are both Sunday);
* month names ``jan``..``dec`` and day names ``sun``..``sat``, case-insensitive, anywhere a number
  may stand (``mon-fri`` works);
* each field is a comma list of ``*``, ``*/step``, ``N``, ``A-B`` or ``A-B/step``; a step must be
  1..the field's maximum; a bare ``N/step`` is rejected as cronie rejects it;
* a field is *starred* when its text starts with ``*`` (so ``*/2`` is starred). When either
  day field is starred a day must match both; when both are restricted, either may match;
* macros: ``@yearly``/``@annually`` = ``0 0 1 1 *``, ``@monthly`` = ``0 0 1 * *``, ``@weekly`` =
  ``0 0 * * 0``, ``@daily``/``@midnight`` = ``0 0 * * *``, ``@hourly`` = ``0 * * * *``.

The text is ASCII: numbers are ``[0-9]`` only (at most :data:`MAX_DIGITS` digits), fields are
separated by spaces and tabs only, so a no-break space, a fullwidth or Arabic-Indic digit or a
superscript is an error, as it is for cronie. A reversed range (``5-1``) is an error (cronie
rejects it too). Stricter than cronie, on purpose (a schedule that silently never fires is a
trap): a day-of-month/month combination that never exists (``0 0 30 2 *``) is an error.

Matching is bounded: :meth:`CronExpr.next_match` never looks past :data:`LAST_DAY` (the last
day whose every wall time is representable in every zone) and answers None there.
"""

from __future__ import annotations

import bisect
import datetime as dt
from dataclasses import dataclass

from dispatcher.cron.errors import CronExpressionError
from scope.foundation.text import is_digits, quote, split_blanks, strip_blanks

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")

# Longest month length per month number; February counts its leap day.
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

# A matching date that exists at all recurs within 28 years (the weekday/leap-year cycle), and
# every month-skipping step below moves at least a day, so this bounds every search.
_HORIZON_DAYS = 366 * 29

MAX_DIGITS = 9
"""Digits one number of an expression may have (leading zeros included)."""

LAST_DAY = dt.date(9999, 12, 30)
"""The last day matched: one day short of ``date.max``, so a wall time on it stays
representable after any zone's offset is applied."""


@dataclass(frozen=True, kw_only=True)
class _Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    name_base: int = 0


_FIELDS = (
    _Field(name="minute", low=0, high=59),
    _Field(name="hour", low=0, high=23),
    _Field(name="day-of-month", low=1, high=31),
    _Field(name="month", low=1, high=12, names=MONTH_NAMES, name_base=1),
    _Field(name="day-of-week", low=0, high=7, names=DAY_NAMES, name_base=0),
)


@dataclass(frozen=True, kw_only=True)
class CronExpr:
    """A parsed crontab expression: the matching value sets plus cronie's star flags."""

    text: str
    """The expression as written (a macro stays a macro)."""
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """Cron numbering: 0 = Sunday .. 6 = Saturday (7 folded into 0)."""
    minute_star: bool
    hour_star: bool
    dom_star: bool
    dow_star: bool

    @property
    def wildcard(self) -> bool:
        """cronie's DST class: the minute or the hour field starts with ``*``."""
        return self.minute_star or self.hour_star

    def day_matches(self, day: dt.date) -> bool:
        """The month and the day-of-month/day-of-week rule (AND if either is starred, else OR)."""
        if day.month not in self.months:
            return False
        in_dom = day.day in self.days
        in_dow = (day.weekday() + 1) % 7 in self.weekdays
        if self.dom_star or self.dow_star:
            return in_dom and in_dow
        return in_dom or in_dow

    def matches(self, wall: dt.datetime) -> bool:
        """Whether the wall-clock minute of ``wall`` matches (seconds are ignored)."""
        if wall.minute not in self.minutes or wall.hour not in self.hours:
            return False
        return self.day_matches(wall.date())

    def next_match(self, start: dt.datetime, last: dt.date = LAST_DAY) -> dt.datetime | None:
        """The first matching whole minute at or after the naive ``start`` and on or before the
        day ``last`` (at most :data:`LAST_DAY`); None when there is none (an expression that
        parsed always matches within 28 years, so None means the bound was reached)."""
        last = min(last, LAST_DAY)
        if start.second or start.microsecond:
            if start.date() > last:
                return None
            start = start.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
        day = start.date()
        first = (start.hour, start.minute)
        for _ in range(_HORIZON_DAYS):
            if day > last:
                return None
            if day.month not in self.months:
                if day.year == last.year and day.month == 12:
                    return None  # the next month is past date.max
                day = _first_of_next_month(day)
                first = (0, 0)
                continue
            if self.day_matches(day):
                found = self._first_time_from(first)
                if found is not None:
                    return dt.datetime.combine(day, dt.time(found[0], found[1]))
            day += dt.timedelta(days=1)
            first = (0, 0)
        return None

    def _first_time_from(self, first: tuple[int, int]) -> tuple[int, int] | None:
        hour, minute = first
        index = bisect.bisect_left(self.hours, hour)
        if index == len(self.hours):
            return None
        if self.hours[index] == hour:
            at = bisect.bisect_left(self.minutes, minute)
            if at < len(self.minutes):
                return hour, self.minutes[at]
            index += 1
            if index == len(self.hours):
                return None
        return self.hours[index], self.minutes[0]

    def __str__(self) -> str:
        return self.text


def parse(text: str) -> CronExpr:
    """Parse a crontab expression or macro; raises :class:`CronExpressionError` (one line)."""
    if not isinstance(text, str):
        raise CronExpressionError(repr(text), "expected a string")
    stripped = strip_blanks(text)
    if not stripped:
        raise CronExpressionError(text, "the expression is empty")
    expanded = stripped
    if stripped.startswith("@"):
        expanded = _macro(stripped)
    parts = split_blanks(expanded)
    if len(parts) != 5:
        raise CronExpressionError(
            stripped,
            f"expected 5 fields (minute hour day-of-month month day-of-week) separated by "
            f"spaces or tabs, got {len(parts)}",
        )
    sets = [_parse_field(part, spec, stripped) for part, spec in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(0 if d == 7 else d for d in sets[4])
    expr = CronExpr(
        text=stripped,
        minutes=tuple(sorted(sets[0])),
        hours=tuple(sorted(sets[1])),
        days=frozenset(sets[2]),
        months=frozenset(sets[3]),
        weekdays=weekdays,
        minute_star=parts[0].startswith("*"),
        hour_star=parts[1].startswith("*"),
        dom_star=parts[2].startswith("*"),
        dow_star=parts[4].startswith("*"),
    )
    _check_possible(expr)
    return expr


def _macro(text: str) -> str:
    key = text.lower() if text.isascii() else text
    if key in MACROS:
        return MACROS[key]
    if key == "@reboot":
        raise CronExpressionError(text, "@reboot is not supported; cron jobs fire on a schedule")
    if key.startswith("@every"):
        raise CronExpressionError(text, "write intervals as 'every: 5m' instead of a schedule")
    known = ", ".join(MACROS)
    raise CronExpressionError(text, f"unknown macro; use one of {known}")


def _parse_field(part: str, spec: _Field, text: str) -> set[int]:
    values: set[int] = set()
    for item in part.split(","):
        if not item:
            raise CronExpressionError(text, f"{spec.name} field {quote(part)}: empty list item")
        values.update(_parse_item(item, spec, text, part))
    return values


def _parse_item(item: str, spec: _Field, text: str, part: str) -> range:
    where = f"{spec.name} field {quote(part)}"
    if "~" in item:
        raise CronExpressionError(text, f"{where}: random '~' ranges are not supported")
    body, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not is_digits(step_text, MAX_DIGITS):
            raise CronExpressionError(
                text, f"{where}: step {quote(step_text)} is not a number 1-{spec.high}"
            )
        step = int(step_text)
        if not 1 <= step <= spec.high:
            raise CronExpressionError(text, f"{where}: step {step} is out of range 1-{spec.high}")
    if body == "*":
        return range(spec.low, spec.high + 1, step)
    first_text, dash, last_text = body.partition("-")
    first = _number(first_text, spec, text, where)
    if not dash:
        if slash:
            raise CronExpressionError(
                text,
                f"{where}: a step needs a range or '*' (write {first}-{spec.high}/{step} "
                f"or */{step})",
            )
        return range(first, first + 1)
    last = _number(last_text, spec, text, where)
    if last < first:
        raise CronExpressionError(
            text,
            f"{where}: range {first}-{last} is reversed; list both parts instead "
            f"({first}-{spec.high},{spec.low}-{last})",
        )
    return range(first, last + 1, step)


def _number(token: str, spec: _Field, text: str, where: str) -> int:
    if is_digits(token, MAX_DIGITS):
        value = int(token)
    elif token.isascii() and token.lower() in spec.names:
        value = spec.names.index(token.lower()) + spec.name_base
    else:
        hint = f"a number {spec.low}-{spec.high} in digits 0-9"
        if spec.names:
            hint += f" or a name like {spec.names[0]!r}"
        if is_digits(token, len(token)) and token:
            hint = f"at most {MAX_DIGITS} digits; {hint}"
        raise CronExpressionError(text, f"{where}: {quote(token)} is not a valid value ({hint})")
    if not spec.low <= value <= spec.high:
        raise CronExpressionError(text, f"{where}: {value} is out of range {spec.low}-{spec.high}")
    return value


def _check_possible(expr: CronExpr) -> None:
    if not (expr.dom_star or expr.dow_star):
        return  # OR rule: the weekdays alone match days in every month
    if any(day <= _MONTH_DAYS[month - 1] for month in expr.months for day in expr.days):
        return
    raise CronExpressionError(
        expr.text, "the day-of-month never occurs in the chosen month(s); this would never fire"
    )


def _first_of_next_month(day: dt.date) -> dt.date:
    if day.month == 12:
        return dt.date(day.year + 1, 1, 1)
    return dt.date(day.year, day.month + 1, 1)
