"""Hypothesis strategies for hostile user text, shared by the property tests, the CLI fuzz test
and the census (``python -m tests.support.census``).

The text is built to hit the holes the issue found: Unicode digits that ``str.isdigit()`` or
``int()`` accept (Arabic-Indic, fullwidth, mathematical, superscripts, circled, Ethiopic),
Unicode blanks that ``str.split()`` treats as separators, numbers past ``int()``'s 4,300-digit
limit, control characters, NUL, lone surrogates (argv bytes that are not UTF-8, as the OS hands
them to Python with ``surrogateescape``) and very long values.
"""

from __future__ import annotations

import datetime as dt

from hypothesis import strategies as st

ODD_DIGITS = "٣٠٩０９𝟘𝟗²³¹①⑨፩߀०௧"
"""Characters that are digits to some of Python's str methods but not to our grammars."""
ODD_BLANKS = "\xa0\u2003\u2009\u3000\u200b\x0b\x0c\x1c\x85\u2028\r\n"
"""Blanks and line breaks other than ASCII space and tab."""
NASTY = "\x00\x1b\x7f\x9f\ud800\udcff\ufeff\u202e"
"""NUL, escapes, DEL, C1, lone surrogates, a BOM and a bidi override."""

any_char = st.characters(codec=None, exclude_categories=())
"""Every code point, surrogates included."""

any_text = st.text(any_char, max_size=40)

os_text = st.binary(max_size=30).map(lambda raw: raw.decode("utf-8", "surrogateescape"))
"""Text as argv arrives from the OS: arbitrary bytes decoded with surrogateescape."""


def _repeat(piece: str, low: int, high: int) -> st.SearchStrategy[str]:
    # Built by map, so a failing example is shown as a count, not as 100 KB of text.
    return st.integers(min_value=low, max_value=high).map(lambda n: piece * n)


huge_numbers = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    _repeat("9", 4290, 4400),
    _repeat("1", 50_000, 100_000),
)

long_text = st.one_of(
    _repeat("x", 81, 400),
    _repeat("a ", 20_000, 50_000),
    _repeat("\u2028", 100, 2000),
)


def near(tokens: list[str], separators: str = " \t") -> st.SearchStrategy[str]:
    """Text close to a grammar: its tokens, odd digits and odd blanks, joined by separators
    that are mostly right (``separators``) and sometimes hostile."""
    atom = st.one_of(
        st.sampled_from(tokens),
        st.sampled_from(list(ODD_DIGITS)),
        st.text(st.sampled_from(list("0123456789" + ODD_DIGITS)), min_size=1, max_size=5),
        st.sampled_from(list(NASTY)),
        st.integers(min_value=-(10**40), max_value=10**40).map(str),
        _repeat("9", 4290, 4400),
    )
    separator = st.one_of(
        st.sampled_from(list(separators)) if separators else st.just(""),
        st.sampled_from(list(ODD_BLANKS)),
        st.just(""),
    )
    pieces = st.lists(st.tuples(atom, separator), min_size=0, max_size=8)
    return pieces.map(lambda parts: "".join(a + b for a, b in parts))


def hostile(tokens: list[str], separators: str = " \t") -> st.SearchStrategy[str]:
    """Any text, weighted towards the near misses of a grammar made of ``tokens``."""
    return st.one_of(
        near(tokens, separators),
        near(tokens, separators),
        any_text,
        os_text,
        huge_numbers,
        long_text,
    )


CRON_TOKENS = [
    "*",
    "*/5",
    "0",
    "5",
    "59",
    "60",
    "1-5",
    "5-1",
    "1-31/2",
    "7",
    ",",
    "-",
    "/",
    "mon-fri",
    "JAN",
    "sun",
    "@daily",
    "@hourly",
    "@reboot",
    "@every",
    "~",
    "L",
    "?",
]
DURATION_TOKENS = ["1", "30", "0.5", ".", "s", "m", "h", "d", "ms", "1h", "30m", "5s", "-", "e3"]
SIZE_TOKENS = ["1", "512", "1.5", "k", "K", "KiB", "MiB", "mb", "G", "tb", "b", "B", "e"]
INT_TOKENS = ["0", "1", "-", "+", "5", "1000", "_", "1_000", "0x10", "1e3"]
ISO_TOKENS = ["2026", "-", "03", "29", "T", ":", "00", "01", "Z", "+01:00", "-05", ".5", "0001"]
ISO_TOKENS += ["9999", "12", "31", "24", "60", "W", " "]
ZONE_TOKENS = ["Europe", "/", "Berlin", "UTC", "America", "New_York", "..", "Etc", "GMT+5"]
ZONE_TOKENS += ["posix", "right", "zone.tab", "", "-"]
ID_TOKENS = ["c_", "r_", "s_", "1a2b", "3f9a", "ABCD", "00", "ff", "g", "_"]
ENV_TOKENS = ["A", "=", "B_1", "export", "#", "'", '"', "\n", "x", "1", "\r\n"]


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[str]) -> str:
    """A valid text with up to three small changes: a character replaced by, or a character
    inserted from, the odd digits, blanks and nasty characters; a digit run made huge."""
    text = draw(valid)
    odd = st.sampled_from(list(ODD_DIGITS + ODD_BLANKS + NASTY))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        change = draw(st.sampled_from(["replace", "insert", "huge"]))
        if change == "replace" and at < len(text):
            text = text[:at] + draw(odd) + text[at + 1 :]
        elif change == "insert":
            text = text[:at] + draw(odd) + text[at:]
        elif at < len(text) and text[at].isdigit():
            text = text[:at] + "9" * draw(st.sampled_from([10, 19, 30, 4400])) + text[at:]
    return text


_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


@st.composite
def _cron_value(draw: st.DrawFn, index: int, low: int, high: int) -> str:
    number = draw(st.integers(low, high))
    names = _MONTHS if index == 3 else _DAYS if index == 4 and number < 7 else None
    if names and draw(st.booleans()):
        name = names[number - 1] if index == 3 else names[number]
        return draw(st.sampled_from([name, name.upper(), name.title()]))
    return str(number)


@st.composite
def _cron_item(draw: st.DrawFn, index: int) -> str:
    low, high = _BOUNDS[index]
    shape = draw(st.sampled_from(["star", "star-step", "value", "range", "range-step"]))
    if shape == "star":
        return "*"
    if shape == "star-step":
        return f"*/{draw(st.integers(1, high))}"
    first = draw(st.integers(low, high))
    first_text = draw(_cron_value(index, first, first))
    if shape == "value":
        return first_text
    last_text = draw(_cron_value(index, first, high))
    text = f"{first_text}-{last_text}"
    return f"{text}/{draw(st.integers(1, high))}" if shape == "range-step" else text


@st.composite
def crontab_expressions(draw: st.DrawFn) -> str:
    """A five-field expression in the crontab grammar, or a macro. (Some name a day that never
    occurs in their months, which parse() refuses; callers filter those.)"""
    if draw(st.integers(0, 15)) == 0:
        return draw(st.sampled_from(["@hourly", "@daily", "@weekly", "@monthly", "@yearly"]))
    fields = [",".join(draw(st.lists(_cron_item(i), min_size=1, max_size=3))) for i in range(5)]
    blanks = draw(st.lists(st.sampled_from([" ", "\t", "  "]), min_size=4, max_size=4))
    return fields[0] + "".join(b + f for b, f in zip(blanks, fields[1:], strict=True))


def crontab_text() -> st.SearchStrategy[str]:
    """Hostile crontab expressions: near misses of the grammar and valid ones, mutated."""
    return st.one_of(hostile(CRON_TOKENS), mutated(crontab_expressions()))


def durations() -> st.SearchStrategy[str]:
    """Durations in the documented grammar."""
    part = st.tuples(st.integers(0, 10**5), st.sampled_from(["d", "h", "m", "s", "ms"]))
    parts = st.lists(part, min_size=1, max_size=4, unique_by=lambda p: p[1])
    spelled = parts.map(lambda ps: "".join(f"{n}{u}" for n, u in ps))
    return st.one_of(spelled, st.integers(0, 10**6).map(str), st.just("1.5h"))


def sizes() -> st.SearchStrategy[str]:
    """Sizes in the documented grammar."""
    units = st.sampled_from(["", "b", "K", "KiB", "MiB", "mb", "G", "gib", "TB", "tib"])
    return st.tuples(st.integers(0, 10**6), units).map(lambda p: f"{p[0]}{p[1]}")


def iso_times() -> st.SearchStrategy[str]:
    """ISO-8601 times in the documented extended form, years 1-9999."""
    moments = st.datetimes(dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31))
    return st.tuples(moments, st.sampled_from(["", "Z", "+01:00", "-05:00", "+14:00"])).map(
        lambda p: p[0].isoformat(timespec="seconds") + p[1]
    )


ZONE_NAMES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Etc/GMT+5"]
ZONE_NAMES += ["Australia/Lord_Howe", "America/Port-au-Prince", "Pacific/Kiritimati"]
