"""Parsers and printers for the values users write in config files and flags: durations, sizes,
percentages, ISO-8601 times and time zone names.

Every parser accepts exactly its ASCII grammar (see :mod:`scope.foundation.text`), bounds the
result so later date arithmetic cannot overflow, and raises
:class:`~scope.foundation.errors.Invalid` (exit 2) whose message quotes at most a short, escaped
piece of the input and shows the accepted forms. Every printed form parses back to the same
value (``parse_duration(format_duration(d)) == d``, likewise for sizes).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import TYPE_CHECKING, Any

from scope.foundation.errors import Invalid
from scope.foundation.text import quote, strip_blanks

if TYPE_CHECKING:  # zoneinfo is imported where a zone is loaded: `kanban defer` needs none
    import zoneinfo

# --- durations -------------------------------------------------------------------------------

MAX_DURATION = 100 * 365 * 86400.0
"""The longest duration accepted (100 years): ``now + duration`` stays a representable date."""

_NUMBER = r"[0-9]{1,18}(?:\.[0-9]{1,9})?"
_DURATION_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d)[ \t]*")
_PLAIN_NUMBER = re.compile(_NUMBER)
_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_HINT = "use seconds (90) or units like 30s, 5m, 2h, 1d, 1h30m, 500ms"
_TOO_LONG = "is longer than 100 years; give at most 36500d"


def parse_duration(value: Any) -> float:
    """Seconds from a number (seconds) or a string like ``30s``, ``5m``, ``1h30m``, ``1d``,
    ``1.5h``, ``500ms`` (each unit at most once; rounded to the millisecond; at most
    :data:`MAX_DURATION`). Raises :class:`Invalid` showing the accepted forms."""
    if isinstance(value, bool):
        raise Invalid(f"expected a duration, got {value!r}; {_DURATION_HINT}")
    if isinstance(value, int | float):
        if (isinstance(value, float) and not math.isfinite(value)) or value < 0:
            raise Invalid(f"duration must be a non-negative number of seconds, got {value!r}")
        if value > MAX_DURATION:
            raise Invalid(f"duration {_TOO_LONG}")
        numerator, denominator = value.as_integer_ratio()  # a float's exact binary value
        return _half_even(numerator * 1000, denominator) / 1000
    if not isinstance(value, str):
        raise Invalid(f"expected a duration, got {type(value).__name__}; {_DURATION_HINT}")
    text = strip_blanks(value)
    text = text.lower() if text.isascii() else text  # "K".lower() is "k": ASCII only
    plain = _PLAIN_NUMBER.fullmatch(text)
    total = _scaled(text) * 1000 if plain else _duration_parts(text, value)
    if total > _MAX_SCALED_MS:
        raise Invalid(f"duration {quote(value)} {_TOO_LONG}")
    return _half_even(total, _SCALE) / 1000


# Exact arithmetic in integers: the grammar allows at most 9 decimals, so every number is a
# whole count of 1e-9 (decimal would do the same, at a millisecond of import per command).
_SCALE = 10**9
_MAX_SCALED_MS = int(MAX_DURATION) * 1000 * _SCALE


def _scaled(number: str) -> int:
    """A number of the duration grammar in units of 1e-9."""
    whole, _, fraction = number.partition(".")
    return int(whole) * _SCALE + int(fraction.ljust(9, "0"))


def _duration_parts(text: str, original: str) -> int:
    """The milliseconds of ``1h30m``-style text, in units of 1e-9."""
    pos, total = 0, 0
    seen: set[str] = set()
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos or match.group(2) in seen:
            break
        seen.add(match.group(2))
        total += _scaled(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise Invalid(f"invalid duration {quote(original)}; {_DURATION_HINT}")
    return total


def _half_even(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded to a whole number, ties to even."""
    quotient, remainder = divmod(numerator, denominator)
    if 2 * remainder > denominator or (2 * remainder == denominator and quotient % 2):
        quotient += 1
    return quotient


def format_duration(seconds: float) -> str:
    """The shortest ``1h30m``-style spelling (``0s`` for zero, ``1m30.5s``, ``250ms``); it
    parses back to ``seconds`` rounded to the millisecond."""
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    whole, fraction = divmod(millis, 1000)
    if not whole:
        return f"{fraction}ms"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    if fraction:
        parts.append(f"{whole}.{fraction:03d}".rstrip("0") + "s")
    elif whole:
        parts.append(f"{whole}s")
    return "".join(parts)


# --- sizes -----------------------------------------------------------------------------------

MAX_SIZE = 2**60
"""The largest size accepted (1 EiB): far above any cap, far below SQLite's 64-bit limit."""

_SIZE = re.compile(
    r"([0-9]{1,19})(?:\.([0-9]{1,9}))?[ \t]*(b|k|kb|kib|m|mb|mib|g|gb|gib|t|tb|tib)?",
    re.IGNORECASE,
)
_SIZE_UNITS = {
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE_HINT = "use bytes (1048576) or units like 512KiB, 256MiB, 1GB"


def parse_size(value: Any) -> int:
    """Bytes from an integer or a string like ``256MiB``, ``10MB``, ``512K``, ``1.5GiB`` (a
    fraction of a byte is dropped; at most :data:`MAX_SIZE`)."""
    if isinstance(value, bool):
        raise Invalid(f"expected a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise Invalid("size must not be negative")
        size = value
    elif isinstance(value, str):
        text = strip_blanks(value)
        match = _SIZE.fullmatch(text) if text.isascii() else None
        if match is None:
            raise Invalid(f"invalid size {quote(value)}; {_SIZE_HINT}")
        whole, fraction, unit = match.group(1), match.group(2) or "", match.group(3) or "b"
        factor = _SIZE_UNITS[unit.lower()]
        size = (int(whole + fraction) * factor) // 10 ** len(fraction)
    else:
        raise Invalid(f"invalid size {quote(value)}; {_SIZE_HINT}")
    if size > MAX_SIZE:
        raise Invalid(f"size is larger than 1 EiB ({MAX_SIZE} bytes); give a smaller one")
    return size


def format_size(size: int) -> str:
    """``256MiB``-style spelling when exact, else plain bytes (parses back to ``size``)."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


# --- percentages -----------------------------------------------------------------------------

_PERCENT = re.compile(r"([0-9]{1,9})(?:\.([0-9]{1,2}))?[ \t]*%")
_PERCENT_HINT = 'write a number with a percent sign, e.g. "150%" or "12.5%"'


def parse_percentage(value: Any) -> float:
    """A percentage from a string such as ``150%`` or ``12.5%`` (at most two decimals, so
    it is an exact count of hundredths of a percent). A bare number is refused: ``150`` could
    mean a share, a percentage or a fraction, so the sign is required."""
    if not isinstance(value, str) or isinstance(value, bool):
        raise Invalid(f"expected a percentage, got {quote(value)}; {_PERCENT_HINT}")
    text = strip_blanks(value)
    match = _PERCENT.fullmatch(text) if text.isascii() else None
    if match is None:
        raise Invalid(f"invalid percentage {quote(value)}; {_PERCENT_HINT}")
    hundredths = int(match.group(1)) * 100 + int((match.group(2) or "").ljust(2, "0"))
    return hundredths / 100


def format_percentage(percent: float) -> str:
    """``150%``-style spelling (two decimals at most; parses back to ``percent``)."""
    return f"{round(percent, 2):g}%"


# --- ISO-8601 times --------------------------------------------------------------------------

_ISO = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r"(?:[Tt ](?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})"
    r"(?::(?P<second>[0-9]{2})(?:[.,](?P<fraction>[0-9]{1,6}))?)?"
    r"(?P<zone>[Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)?)?"
)
ISO_HINT = "use e.g. 2026-03-29, 2026-03-29T01:00 or 2026-03-29T01:00:00+01:00"


def parse_iso_time(text: str, zone: dt.tzinfo | None) -> dt.datetime:
    """A datetime from ISO-8601 extended form: a date, optionally ``T`` (or a space) and
    ``HH:MM[:SS[.ffffff]]``, optionally ``Z`` or ``±HH[:MM]``. A time without an offset is a
    wall time in ``zone`` (naive when ``zone`` is None). Raises :class:`Invalid` for anything
    else."""
    match = _ISO.fullmatch(strip_blanks(text))
    if match is None:
        raise Invalid(f"invalid ISO-8601 time {quote(text)}; {ISO_HINT}")
    part = {key: int(value) for key, value in match.groupdict().items() if _numeric(key, value)}
    fraction = (match.group("fraction") or "").ljust(6, "0")
    try:
        moment = dt.datetime(
            part["year"],
            part["month"],
            part["day"],
            part.get("hour", 0),
            part.get("minute", 0),
            part.get("second", 0),
            int(fraction),
            tzinfo=_offset(match.group("zone"), text) or zone,
        )
    except ValueError as err:
        raise Invalid(f"invalid ISO-8601 time {quote(text)}: {err}; {ISO_HINT}") from None
    return moment


def _numeric(key: str, value: str | None) -> bool:
    return value is not None and key not in ("zone", "fraction")


def _offset(text: str | None, original: str) -> dt.tzinfo | None:
    if text is None:
        return None
    if text in "Zz":
        return dt.UTC
    digits = text[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:] or 0)
    if hours > 23 or minutes > 59:
        raise Invalid(f"invalid UTC offset {quote(text)} in {quote(original)}; {ISO_HINT}")
    delta = dt.timedelta(hours=hours, minutes=minutes)
    return dt.timezone(-delta if text[0] == "-" else delta)


# --- time zone names -------------------------------------------------------------------------

_ZONE_NAME = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*")
MAX_ZONE_NAME = 255


def load_zone_info(name: Any) -> zoneinfo.ZoneInfo:
    """The IANA zone ``name`` (``Europe/Berlin``); :class:`Invalid` when it is not a zone name
    or this host has no such zone."""
    import zoneinfo

    problem = f"unknown time zone {quote(name)}; use an IANA name such as Europe/Berlin or UTC"
    if not isinstance(name, str) or len(name) > MAX_ZONE_NAME or not _ZONE_NAME.fullmatch(name):
        raise Invalid(problem)
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise Invalid(problem) from None
