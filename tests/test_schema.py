"""Pure logic of the config schema: durations, sizes, kinds, line numbers."""

from __future__ import annotations

import pytest

from scope.foundation.errors import ConfigError
from scope.foundation.schema import (
    Invalid,
    format_duration,
    format_size,
    load_yaml,
    parse_duration,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (90, 90.0),
        ("90", 90.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1d2h3m4s", 93784.0),
        ("500ms", 0.5),
        (" 1H ", 3600.0),
        (0, 0.0),
        (1.5, 1.5),
    ],
)
def test_durations_parse(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "m", "1m1m", "-5", -5, True, "1h 30", [1], "s5"])
def test_bad_durations_are_rejected_with_the_accepted_forms(text: object) -> None:
    with pytest.raises(Invalid) as info:
        parse_duration(text)
    assert "duration" in info.value.problem


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (60, "1m"), (5400, "1h30m"), (86400, "1d"), (0.25, "250ms")]
)
def test_durations_format_round_trip(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "size"),
    [(1024, 1024), ("256MiB", 256 * 1024**2), ("10MB", 10_000_000), ("512K", 524288), ("7", 7)],
)
def test_sizes(text: object, size: int) -> None:
    assert parse_size(text) == size


def test_size_formatting() -> None:
    assert format_size(256 * 1024**2) == "256MiB"
    assert format_size(1000) == "1000"


def test_yaml_lines_are_recorded_for_keys_and_items() -> None:
    located = load_yaml("a:\n  b: 1\n  c:\n    - x\n    - y\n", "f.yaml")
    assert located.data == {"a": {"b": 1, "c": ["x", "y"]}}
    assert located.line_of(("a", "b")) == 2
    assert located.line_of(("a", "c", 1)) == 5
    assert located.line_of(("a", "missing")) == 1


def test_duplicate_keys_are_errors_with_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_yaml("a: 1\nb: 2\na: 3\n", "f.yaml")
    assert info.value.message == "f.yaml:3: duplicate key 'a'"


def test_yaml_syntax_errors_carry_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_yaml("a:\n  b: [1, 2\nc: 3\n", "f.yaml")
    assert info.value.fields["line"] is not None
    assert info.value.message.startswith("f.yaml:")


def test_unsafe_tags_are_rejected() -> None:
    with pytest.raises(ConfigError):
        load_yaml("a: !!python/object/apply:os.system ['true']\n", "f.yaml")
