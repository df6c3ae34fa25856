"""Hypothesis strategies for hostile user text, shared by the property tests, the CLI fuzz test
and the census (``python -m tests.support.census``).

The text is built to hit the holes the issue found: Unicode digits that ``str.isdigit()`` or
``int()`` accept (Arabic-Indic, fullwidth, mathematical, superscripts, circled, Ethiopic),
Unicode blanks that ``str.split()`` treats as separators, numbers past ``int()``'s 4,300-digit
limit, control characters, NUL, lone surrogates (argv bytes that are not UTF-8, as the OS hands
them to Python with ``surrogateescape``) and very long values.
"""

from __future__ import annotations

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


def crontab_text() -> st.SearchStrategy[str]:
    """Hostile crontab expressions."""
    return hostile(CRON_TOKENS)
