"""Property tests for every parser of user text (issue 15).

(a) Any text gives a parsed value or the project's own error, never another exception, and
nothing outside the documented ASCII grammar is accepted (tests/support/parsercheck.py holds
the parsers, the hostile strategies and an independent oracle per grammar).
(b) Text generated from each grammar is accepted with the value it spells.
(c) Printed forms parse back to the value: durations, sizes, fire keys, ISO times.
"""

from __future__ import annotations

import datetime as dt
import string

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dispatcher.cron.timeline import fire_key, parse_fire_key
from scope.foundation.errors import Invalid
from scope.foundation.text import QUOTE_LIMIT, parse_int, quote
from scope.foundation.values import (
    MAX_DURATION,
    MAX_SIZE,
    format_duration,
    format_size,
    parse_duration,
    parse_iso_time,
    parse_size,
)
from tests.support import hostile
from tests.support.parsercheck import TARGETS, Target, outcome


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
@given(data=st.data())
def test_any_text_is_parsed_or_refused_with_our_error(target: Target, data: st.DataObject) -> None:
    text = data.draw(target.strategy, label="text")
    kind, err = outcome(target, text)
    if kind == "crash":
        raise AssertionError(f"{target.name} crashed on {text!r}") from err
    assert kind != "wrong", f"{target.name} accepted {text!r}, which is outside its grammar"


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_error_lines_quote_at_most_a_short_piece_of_the_input(target: Target) -> None:
    from scope.foundation.errors import DispatchError

    for text in ("7" * 100_000, "x" * 100_000 + "\n", "\u2028" * 50_000, "c_" + "a" * 10**5):
        try:
            target.parse(text)
        except DispatchError as err:
            assert len(err.message) < 600, (target.name, len(err.message))
            assert "\n" not in err.message and "\u2028" not in err.message


# -- (b) the grammar is accepted ----------------------------------------------------------------

_units = st.sampled_from([("d", 86400), ("h", 3600), ("m", 60), ("s", 1), ("ms", 0.001)])


@given(
    parts=st.lists(
        st.tuples(st.integers(0, 10**4), _units), min_size=1, max_size=5, unique_by=lambda p: p[1]
    ),
    blanks=st.sampled_from(["", " ", "\t", "  "]),
    upper=st.booleans(),
)
def test_durations_in_the_grammar_are_accepted(parts, blanks: str, upper: bool) -> None:
    text = blanks.join(f"{count}{unit}" for count, (unit, _) in parts)
    text = blanks + (text.upper() if upper else text) + blanks
    expected = sum(count * round(size * 1000) for count, (_, size) in parts) / 1000
    assert parse_duration(text) == expected


@given(whole=st.integers(0, 10**6), unit=st.sampled_from(["", "b", "K", "KiB", "MB", "gib", "T"]))
def test_sizes_in_the_grammar_are_accepted(whole: int, unit: str) -> None:
    factor = {"": 1, "b": 1, "k": 1024, "kib": 1024, "mb": 10**6, "gib": 1024**3, "t": 1024**4}
    assert parse_size(f"{whole}{unit}") == whole * factor[unit.lower()]


@given(value=st.integers(-(10**18) + 1, 10**18 - 1), pad=st.sampled_from(["", " ", "\t"]))
def test_whole_numbers_are_accepted_within_their_bounds(value: int, pad: str) -> None:
    assert parse_int(f"{pad}{value}{pad}") == value


# -- (c) round trips ----------------------------------------------------------------------------


@given(millis=st.integers(0, int(MAX_DURATION * 1000)))
def test_a_printed_duration_parses_back(millis: int) -> None:
    seconds = millis / 1000
    text = format_duration(seconds)
    assert parse_duration(text) == seconds, text
    assert set(text) <= set(string.digits + ".dhms")


@given(text=hostile.hostile(hostile.DURATION_TOKENS))
def test_parsed_durations_print_and_parse_back(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except Invalid:  # only accepted texts matter here
        return
    assert parse_duration(format_duration(seconds)) == seconds


@given(size=st.integers(0, MAX_SIZE))
def test_a_printed_size_parses_back(size: int) -> None:
    assert parse_size(format_size(size)) == size


_walls = st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)).map(
    lambda w: w.replace(microsecond=w.microsecond // 1000 * 1000)
)


@given(
    job=st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True),
    wall=_walls,
    fold=st.sampled_from([0, 1]),
)
def test_fire_keys_parse_back(job: str, wall: dt.datetime, fold: int) -> None:
    assert parse_fire_key(fire_key(job, wall, fold)) == (job, wall, fold)


@given(
    moment=st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)),
    offset=st.integers(-23 * 60 - 59, 23 * 60 + 59),
)
def test_iso_times_parse_back(moment: dt.datetime, offset: int) -> None:
    aware = moment.replace(tzinfo=dt.timezone(dt.timedelta(minutes=offset)))
    for text in (aware.isoformat(), moment.isoformat(), moment.isoformat(sep=" ")):
        parsed = parse_iso_time(text, dt.UTC)
        expected = aware if "+" in text[10:] or "-" in text[10:] else moment.replace(tzinfo=dt.UTC)
        assert parsed == expected, text


@given(text=hostile.any_text | hostile.long_text)
def test_quote_is_short_escaped_and_one_line(text: str) -> None:
    shown = quote(text)
    assert len(shown) <= 4 * QUOTE_LIMIT + 40
    assert shown.isprintable()


# -- exact rounding: integer arithmetic against decimal's ---------------------------------------

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _decimal_seconds(parts: list[tuple[str, str]]) -> float | None:
    """An independent oracle: the sum in decimal, rounded half-even to the millisecond
    (None when past the 100-year bound)."""
    from decimal import ROUND_HALF_EVEN, Decimal

    total = sum((Decimal(number) * _UNIT_MS[unit] for number, unit in parts), Decimal(0))
    if total > Decimal(MAX_DURATION) * 1000:
        return None
    return int(total.quantize(Decimal(1), rounding=ROUND_HALF_EVEN)) / 1000


_decimals = st.builds(
    lambda whole, fraction: f"{whole}.{fraction}" if fraction else str(whole),
    st.integers(0, 10**12),
    st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=9)),
)


@given(
    parts=st.lists(st.tuples(_decimals, st.sampled_from(list(_UNIT_MS))), min_size=1, max_size=5)
)
@example(parts=[("0.0005", "s")])  # ties at half a millisecond go to the even neighbour
@example(parts=[("0.0015", "s")])
@example(parts=[("2.5", "ms")])
@example(parts=[("1", "h"), ("0.5", "ms")])
def test_durations_round_exactly_like_decimal(parts: list[tuple[str, str]]) -> None:
    unique = list({unit: (number, unit) for number, unit in parts}.values())
    text = "".join(number + unit for number, unit in unique)
    expected = _decimal_seconds(unique)
    if expected is None:
        with pytest.raises(Invalid):
            parse_duration(text)
    else:
        assert parse_duration(text) == expected, text


@given(seconds=st.one_of(st.floats(0, MAX_DURATION), st.integers(0, int(MAX_DURATION))))
def test_numeric_durations_round_exactly_like_decimal(seconds: float) -> None:
    from decimal import ROUND_HALF_EVEN, Decimal

    scaled = Decimal(seconds) * 1000
    expected = int(scaled.quantize(Decimal(1), rounding=ROUND_HALF_EVEN)) / 1000
    assert parse_duration(seconds) == expected
    if isinstance(seconds, int):
        assert parse_duration(str(seconds)) == expected
