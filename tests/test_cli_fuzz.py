"""The CLI as a whole never shows a traceback (issue 15, item 3).

Hypothesis builds command lines from the real argument parser (every command and option it
registers) filled with hostile values: random Unicode, argv bytes that are not UTF-8 (lone
surrogates, as the OS hands them to Python), empty strings, huge and Unicode numbers,
option-like words, very long values and the ids of real cards, runs and sessions. Each runs
in-process through ``dispatcher.cli.main.main`` against a private config and state dir whose
workers are all ``true``. The rules checked for every command line:

* it ends with exit 0, 1 or 2 (``run``/``wait``/``cron run`` may also pass a worker's result
  through: 124 timed out, 127 failed_start); no exception escapes ``main``;
* stderr holds at most one ``error:`` line (``config check`` names every error of a file, one
  line each), every line starts with ``dispatch:`` and none is longer than 1,000 characters;
* on exit 2 every file in the state dir is byte-identical to before (SQLite's ``-shm`` index
  excepted: readers update it).

What would run unbounded is kept out: ``serve``, ``-f``/``--follow`` and a view's ``--watch``
are never generated, ``run`` always runs ``true``, the options that pick the config and state
dir keep their test values, and paths a command would create stay in the test's directory.
A handful of real processes then check the same with raw bytes on the command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.clifuzz import (
    World,
    command_lines,
    inside,
    make_world,
    problems,
    run_main,
    seed,
    snapshot,
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("fuzz")
    here = make_world(root)
    with inside(root):
        seed(here)
        yield here


@pytest.mark.slow
def test_generated_command_lines_end_cleanly(world: World) -> None:
    budget = settings.default.max_examples * 5

    @settings(max_examples=budget)
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        command, words = data.draw(command_lines(world.ids), label="argv")
        assert problems(world, command, words) == [], words

    one()
    print(f"cli fuzz: {world.tried} command lines, exits {dict(sorted(world.exits.items()))}")


@pytest.mark.parametrize(
    ("words", "code", "fires", "said"),
    [
        (
            ["--expr", "* * * * *", "--from", "0001-01-01T00:00", "--tz", "Asia/Tokyo"],
            2,
            0,
            "--from",
        ),
        (["--expr", "* * * * *", "--from", "0001-01-02T00:00Z", "--tz", "Etc/GMT+12"], 0, 5, ""),
        (["--expr", "* * * * *", "--from", "9999-12-29T23:58", "--tz", "UTC"], 0, 5, ""),
        (
            ["--expr", "59 23 31 12 *", "--from", "9999-01-01", "--tz", "Pacific/Kiritimati"],
            0,
            0,
            "0 of 5",
        ),
        (["--expr", "* * * * *", "--from", "9999-12-31T00:00", "--tz", "UTC"], 2, 0, "outside"),
        (
            ["--expr", "0 0 * * *", "--from", "9999-12-28", "--count", "9", "--tz", "UTC"],
            0,
            2,
            "2 of 9",
        ),
    ],
)
def test_from_near_the_ends_of_the_calendar(
    world: World, words: list[str], code: int, fires: int, said: str
) -> None:
    got, out, err = run_main(world, ["cron", "next", *words])
    assert (got, len(out.splitlines())) == (code, fires), err
    assert len(err.splitlines()) == (1 if said else 0) and said in err


# -- real processes -------------------------------------------------------------------------


def _process(
    world: World, *words: bytes | str, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-m", "dispatcher.cli.main", *world.argv([]), *words]
    return subprocess.run(
        [os.fsencode(w) for w in argv],
        env=world.env | {"LC_ALL": "C.UTF-8"},
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
        cwd=world.root,
    )


@pytest.mark.parametrize(
    "words",
    [
        [b"cron", b"next", b"--expr", b"\xff\xfe * * * *"],
        [b"kanban", b"add", b"title \xff", b"--assignee", b"worker"],
        [b"cron", b"next", b"--expr", b"1" * 100_000],
        [b"cron", b"next", b"--expr", b"* * * * *", b"--count", b"9" * 5000],
        [b"cron", b"next", b"--expr", "* * * *\u00a0*".encode()],
        [b"kanban", b"list", b"--status", b"\xc3(" * 50_000],
        [b"serve", b"--log-level", b"\xff"],
        [b"--state-dir", b"state-\xff", b"kanban", b"list"],
    ],
    ids=[
        "bytes-expr",
        "bytes-title",
        "long-expr",
        "huge-count",
        "nbsp",
        "long-choice",
        "serve",
        "bytes-state-dir",
    ],
)
def test_real_processes_refuse_in_one_line(world: World, words: list[bytes]) -> None:
    before = snapshot(world.state)
    proc = _process(world, *words)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and b"Traceback" not in proc.stderr, proc.stderr[:2000]
    assert len(lines[0]) < 500, len(lines[0])
    assert snapshot(world.state) == before


def test_a_sparse_schedule_stops_at_the_end_of_the_calendar(world: World) -> None:
    proc = _process(
        world, "cron", "next", "--expr", "0 0 29 2 */7", "--count", "1000", "--tz", "UTC"
    )
    assert proc.returncode == 0, proc.stderr
    fires = proc.stdout.decode().splitlines()
    assert len(fires) == 259 and fires[-1] == "9976-02-29T00:00:00+00:00"
    assert proc.stderr.decode().count("\n") == 1 and b"259 of 1000" in proc.stderr


def test_undecodable_argv_bytes_come_back_as_the_same_bytes(world: World) -> None:
    (world.root / os.fsdecode(b"dir-\xe9")).mkdir()
    script = 'pwd; printf "%s\\n" "$0"'
    started = _process(
        world, "run", "--wait", "--cwd", b"dir-\xe9", "--", "sh", "-c", script, b"caf\xe9"
    )
    assert started.returncode == 0, started.stderr
    listing = _process(world, "ps", "--all")
    assert listing.returncode == 0, listing.stderr
    assert b"caf\xe9" in listing.stdout
    session = started.stdout.split()[0]
    log = _process(world, "logs", session)
    assert log.stdout == bytes(world.root / os.fsdecode(b"dir-\xe9")) + b"\ncaf\xe9\n"
