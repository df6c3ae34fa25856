"""Watch-pattern logic on its own: whole lines across reads, cooldown, strikes, caps, breaker."""

from __future__ import annotations

import pytest

from registry.abc import WatchPattern
from registry.live.watch import (
    MAX_LINE_BYTES,
    Breaker,
    LineBuffer,
    Matcher,
    Verdict,
    WatchGate,
    parse_patterns,
)
from scope.foundation.errors import UsageError


def test_lines_split_across_reads_come_out_whole() -> None:
    buffer = LineBuffer()
    assert buffer.feed(0, b"ERR") == []
    assert buffer.feed(3, b"OR here\nnext") == [b"ERROR here"]
    assert buffer.offset == 11
    assert buffer.feed(15, b" line\n") == [b"next line"]
    assert buffer.flush() == []
    assert buffer.offset == 21


def test_overlap_is_skipped_and_a_gap_is_filled_from_the_log() -> None:
    log = b"alpha\nbeta\ngamma\n"
    buffer = LineBuffer(0, fill=lambda a, b: log[a:b])
    assert buffer.feed(0, log[:8]) == [b"alpha"]
    assert buffer.feed(3, log[3:8]) == []  # seen already
    assert buffer.feed(11, log[11:]) == [b"beta", b"gamma"]  # [8, 11) read from the log


def test_unterminated_last_line_is_flushed_and_long_lines_are_bounded() -> None:
    buffer = LineBuffer()
    assert buffer.feed(0, b"no newline") == []
    assert buffer.flush() == [b"no newline"]
    huge = b"x" * (MAX_LINE_BYTES + 10)
    pieces = LineBuffer().feed(0, huge)
    assert pieces == [b"x" * MAX_LINE_BYTES]


def test_matcher_substring_and_regex() -> None:
    matcher = Matcher(parse_patterns(["ERROR", WatchPattern(pattern=r"fail(ed)?\b", regex=True)]))
    assert matcher.match("an ERROR here") == WatchPattern(pattern="ERROR")
    assert matcher.match("it failed") == WatchPattern(pattern=r"fail(ed)?\b", regex=True)
    assert matcher.match("error in lower case") is None


@pytest.mark.parametrize(
    "bad", ["", WatchPattern(pattern="(", regex=True), "two\nlines"], ids=["empty", "regex", "nl"]
)
def test_bad_patterns_are_usage_errors(bad: str | WatchPattern) -> None:
    with pytest.raises(UsageError):
        parse_patterns([bad])


def gate(**overrides: int | float) -> WatchGate:
    values: dict[str, int | float] = {"cooldown": 15.0, "strike_limit": 3, "lifetime_cap": 8}
    values.update(overrides)
    return WatchGate(**values)  # type: ignore[arg-type]


def test_cooldown_suppresses_and_counts_then_reports() -> None:
    g = gate()
    assert g.offer(0.0, 1, breaker_open=False) is Verdict.DELIVER
    assert g.offer(5.0, 2, breaker_open=False) is Verdict.SUPPRESS
    assert g.suppressed == 2
    assert g.offer(15.0, 1, breaker_open=False) is Verdict.DELIVER
    assert g.strikes == 1  # the first window had drops
    assert g.take_suppressed() == 2
    assert g.suppressed == 0 and g.suppressed_total == 2


def test_three_windows_with_drops_disable_watching() -> None:
    g = gate()
    now = 0.0
    verdicts = []
    for _ in range(4):
        verdicts.append(g.offer(now, 1, breaker_open=False))
        verdicts.append(g.offer(now + 1, 1, breaker_open=False))  # a drop in this window
        now += 20
    assert verdicts[:6] == [Verdict.DELIVER, Verdict.SUPPRESS] * 3
    assert verdicts[6] is Verdict.DISABLE
    assert g.disabled is not None and "registry.watch_strikes" in g.disabled
    assert g.offer(now + 100, 1, breaker_open=False) is Verdict.SUPPRESS


def test_quiet_windows_are_no_strikes_and_the_lifetime_cap_disables() -> None:
    g = gate(lifetime_cap=3)
    assert [g.offer(t * 20.0, 1, breaker_open=False) for t in range(4)] == [
        Verdict.DELIVER,
        Verdict.DELIVER,
        Verdict.DELIVER,
        Verdict.DISABLE,
    ]
    assert g.strikes == 0
    assert g.disabled is not None and "lifetime cap of 3" in g.disabled


def test_breaker_suppresses_without_striking() -> None:
    g = gate()
    assert g.offer(0.0, 1, breaker_open=True) is Verdict.SUPPRESS
    assert g.breaker_suppressed == 1 and g.strikes == 0 and g.deliveries == 0
    assert g.offer(1.0, 1, breaker_open=False) is Verdict.DELIVER


def test_global_breaker_opens_per_minute() -> None:
    breaker = Breaker(limit=2)
    assert not breaker.is_open(0.0)
    breaker.record(0.0)
    breaker.record(1.0)
    assert breaker.is_open(2.0)
    assert breaker.tripped == 1
    assert not breaker.is_open(61.0)


def test_gate_state_round_trips() -> None:
    g = gate()
    g.offer(0.0, 1, breaker_open=False)
    g.offer(1.0, 1, breaker_open=False)
    restored = gate()
    assert restored.load(g.to_json(offset=42)) == 42
    assert (restored.deliveries, restored.suppressed_total) == (1, 1)
