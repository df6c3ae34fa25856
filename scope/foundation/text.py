"""Text a user typed, handled safely: ASCII numbers and blanks, and quoting for error lines.

Python's string methods are Unicode-aware where our grammars are not: ``"٣".isdigit()`` and
``int("٣")`` accept Arabic-Indic digits, ``"²".isdigit()`` is true but ``int("²")`` fails,
``str.split()`` and ``str.strip()`` treat a no-break space as a blank, ``int()`` refuses more
than 4,300 digits and accepts ``1_000``. Every parser of user text (crontab, durations, sizes,
counts, ids, times, env files) goes through these helpers instead, so it accepts exactly its
ASCII grammar; and every error line shows at most :data:`QUOTE_LIMIT` characters of what was
typed, escaped, so a 100 KB argument cannot make a 100 KB error line or move the cursor.

Pure functions, no I/O; errors are :class:`~scope.foundation.errors.Invalid` (exit 2).
"""

from __future__ import annotations

import re

from scope.foundation.errors import Invalid

QUOTE_LIMIT = 80
"""Characters of user input an error line shows before it is cut."""

BLANKS = " \t"
"""The only characters that separate fields (crontab, env files) or surround a value."""

MAX_DIGITS = 18
"""Default cap on the digits of one number (any count or bound we take fits in 18)."""

_DIGITS = re.compile(r"[0-9]+")
_BLANK_RUN = re.compile(r"[ \t]+")
# What never belongs in a stored value: control characters (Unicode category Cc: C0, DEL,
# C1), lone surrogates (Cs: argv bytes that were not UTF-8), line and paragraph separators
# (Zl, Zp). A regex, not a per-character loop: bodies may be megabytes.
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")
_UNSAFE_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")


def quote(text: object, limit: int = QUOTE_LIMIT) -> str:
    """``text`` for an error line: quoted and escaped like :func:`repr`, cut to about
    ``limit`` characters with the full length named (``'aaaa'... (100000 characters)``)."""
    if not isinstance(text, str):
        try:
            return _clip(repr(text), limit)
        except ValueError:  # an int past the 4,300-digit conversion limit
            return "a number of more than 4300 digits"
    cut = min(len(text), limit)
    # Escapes widen the text (one U+2028 is six characters): cut until the quote fits.
    while cut > 8 and len(repr(text[:cut])) > limit + 2:
        cut = cut * 2 // 3
    if cut == len(text):
        return repr(text)
    return f"{text[:cut]!r}... ({len(text)} characters)"


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun`` as a person writes them: ``1 cron job``, ``0 cron jobs``,
    ``2 assignees``. ``many`` is the plural when adding an ``s`` is wrong (``1 entry``)."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"


def one_line(text: str, limit: int = 2000) -> str:
    """A message made safe for one terminal line: control characters and line breaks escaped,
    at most ``limit`` characters (a backstop; parsers quote with :func:`quote` already)."""
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else _escape(ch) for ch in text)
    return _clip(text, limit)


def strip_blanks(text: str) -> str:
    """``text`` without surrounding ASCII spaces and tabs (nothing else is stripped)."""
    return text.strip(BLANKS)


def split_blanks(text: str) -> list[str]:
    """The fields of ``text`` separated by runs of ASCII spaces and tabs."""
    return [part for part in _BLANK_RUN.split(text) if part]


def is_digits(text: str, max_digits: int = MAX_DIGITS) -> bool:
    """Whether ``text`` is 1 to ``max_digits`` ASCII digits and nothing else."""
    return 0 < len(text) <= max_digits and _DIGITS.fullmatch(text) is not None


def parse_int(
    text: str,
    what: str = "",
    *,
    low: int | None = None,
    high: int | None = None,
    max_digits: int = MAX_DIGITS,
) -> int:
    """A whole number written in ASCII digits (optionally a leading ``-``) within
    ``low``..``high``; :class:`Invalid` naming ``what`` and the accepted form otherwise."""
    body = strip_blanks(text)
    negative = body.startswith("-")
    digits = body[1:] if negative else body
    bounds = _bounds(low, high)
    prefix = f"{what}: " if what else ""
    if not _DIGITS.fullmatch(digits):
        raise Invalid(f"{prefix}{quote(text)} is not a whole number; use digits 0-9{bounds}")
    if len(digits) > max_digits:
        raise Invalid(f"{prefix}{quote(text)} has more than {max_digits} digits{bounds}")
    value = -int(digits) if negative else int(digits)
    if (low is not None and value < low) or (high is not None and value > high):
        raise Invalid(f"{prefix}{value} is out of range{bounds}")
    return value


def unsafe_char(text: str, *, newlines: bool = False) -> str | None:
    """The first character of ``text`` that has no place in a stored value, described
    (``'NUL'``, ``'U+001B'``, ``'an undecodable byte'``), or None when every one is fine.

    Refused: control characters (tab too unless ``newlines``; then tab, LF and CR pass),
    lone surrogates (bytes of argv that were not UTF-8) and Unicode line separators."""
    found = (_UNSAFE_TEXT if newlines else _UNSAFE_LINE).search(text)
    return None if found is None else _describe(found.group())


def _describe(ch: str) -> str:
    if "\ud800" <= ch <= "\udfff":
        return "a byte that is not UTF-8"
    if ch == "\0":
        return "a NUL byte"
    if ch in "\u2028\u2029":
        return f"the line separator U+{ord(ch):04X}"
    return f"the control character U+{ord(ch):04X}"


def _escape(ch: str) -> str:
    return repr(ch)[1:-1]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _bounds(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f" ({low} to {high})"
    if low is not None:
        return f" (at least {low})"
    if high is not None:
        return f" (at most {high})"
    return ""
