"""The keeper's terminal-query responder: unit cases, then real PTY workers that block on it."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.abc import SessionState
from registry.keeper.program import HOLD_MAX, TermResponder
from tests.support.keepers import START_PATHS, start_path
from tests.support.leaks import LeakGuard
from tests.test_events_support import registry_at
from tests.test_registry_support import request


def responder() -> TermResponder:
    return TermResponder(24, 80)


@pytest.mark.parametrize(
    ("query", "answer"),
    [
        (b"\x1b[5n", b"\x1b[0n"),
        (b"\x1b[6n", b"\x1b[1;2R"),  # after the "a"
        (b"\x1b[?6n", b"\x1b[?1;2R"),
        (b"\x1b[18t", b"\x1b[8;24;80t"),
        (b"\x1b[?2026$p", b"\x1b[?2026;0$y"),
        (b"\x1b[4$p", b"\x1b[4;0$y"),
        (b"\x1b[c", b"\x1b[?1;2c"),
        (b"\x1b[0c", b"\x1b[?1;2c"),
        (b"\x1b[>c", b"\x1b[>0;10;0c"),
    ],
)
def test_queries_are_answered_and_stripped(query: bytes, answer: bytes) -> None:
    out, replies = responder().feed(b"a" + query + b"b")
    assert (out, replies) == (b"ab", answer)


def test_other_sequences_pass_through_untouched() -> None:
    data = b"\x1b[1mbold\x1b[0m \x1b]0;title\x07 \x1b(B \x1b[?25l\x1b[2J"
    assert responder().feed(data) == (data, b"")


def test_a_query_split_across_reads_is_held_back_then_answered() -> None:
    term = responder()
    assert term.feed(b"abc\x1b") == (b"abc", b"")
    assert term.feed(b"[") == (b"", b"")
    assert term.feed(b"6") == (b"", b"")
    assert term.feed(b"nrest") == (b"rest", b"\x1b[1;4R")


def test_a_held_partial_sequence_is_flushed_at_the_end() -> None:
    term = responder()
    assert term.feed(b"tail\x1b[12") == (b"tail", b"")
    assert term.flush() == b"\x1b[12"
    assert term.flush() == b""


def test_an_overlong_unfinished_sequence_is_plain_output() -> None:
    data = b"\x1b[" + b"1;" * HOLD_MAX
    out, replies = responder().feed(data)
    assert out == data and replies == b""


def test_cursor_is_tracked_plausibly() -> None:
    term = responder()
    assert term.feed(b"prompt> \x1b[6n")[1] == b"\x1b[1;9R"
    assert term.feed(b"\r\nnext \xc3\xa9\x1b[6n")[1] == b"\x1b[2;7R"
    assert term.feed(b"\x1b[10;20H\x1b[6n")[1] == b"\x1b[10;20R"
    assert term.feed(b"\x1b[3A\x1b[5D\x1b[6n")[1] == b"\x1b[7;15R"
    assert term.feed(b"\x1b[99;99H\x1b[6n")[1] == b"\x1b[24;80R"  # clamped to the screen
    term = responder()
    assert term.feed(b"x" * 85 + b"\x1b[6n")[1] == b"\x1b[2;6R"  # wrapped at 80 columns


# -- real PTY workers ---------------------------------------------------------------------------

# Puts its terminal in raw mode (as real programs do before asking), asks, and blocks until the
# answer arrives: without a responder this never ends.
ASKS = textwrap.dedent(
    """
    import os, sys, termios, time, tty
    old = termios.tcgetattr(0)
    tty.setraw(0)

    def ask(query, end, split=False):
        if split:
            os.write(1, query[:3]); time.sleep(0.2); os.write(1, query[3:])
        else:
            os.write(1, query)
        got = b""
        while not got.endswith(end):
            got += os.read(0, 1)
        return got

    cursor = ask(b"before\\x1b[6n", b"R")
    size = ask(b"\\x1b[18t", b"t", split=True)
    attrs = ask(b"\\x1b[c", b"c")
    termios.tcsetattr(0, termios.TCSADRAIN, old)
    print("answers", cursor, size, attrs)
    sys.stdout.write("end\\x1b[")
    """
)


@pytest.fixture(params=START_PATHS)
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """The real PTY workers below run over both keeper start paths."""
    with start_path(request.param) as name:
        yield name


def test_a_pty_program_waiting_for_its_cursor_query_completes(
    path: str, tmp_path: Path, leak_guard: LeakGuard
) -> None:
    with registry_at(tmp_path / "state") as registry:
        session = registry.spawn(request([sys.executable, "-c", ASKS], pty=True))
        done = registry.wait(session.id, timeout=20).snapshot.session
        assert done.state is SessionState.EXITED and done.exit_code == 0
        log = registry.read_log(session.id)
    assert log.startswith(b"before")
    assert rb"answers b'\x1b[1;7R' b'\x1b[8;24;80t' b'\x1b[?1;2c'" in log
    for query in (b"\x1b[6n", b"\x1b[18t", b"\x1b[c"):
        assert query not in log
    # The partial sequence at the very end is ordinary output, flushed when the stream ended.
    assert log.endswith(b"end\x1b[")
    assert done.total_bytes == len(log)


def test_pipe_mode_output_is_never_interpreted(path: str, tmp_path: Path) -> None:
    with registry_at(tmp_path / "state") as registry:
        session = registry.spawn(request(["printf", "x\\033[6ny"]))
        registry.wait(session.id, timeout=10)
        assert registry.read_log(session.id) == b"x\x1b[6ny"
