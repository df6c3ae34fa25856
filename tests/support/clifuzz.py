"""Driving the real ``dispatch`` argument parser and commands with generated command lines.

Shared by tests/test_cli_fuzz.py (which asserts that no command line breaks the rules) and the
census (``python -m tests.support.census``, which counts how many do). See the test module's
docstring for the rules; :func:`problems` checks them for one command line.

Command lines come from the parser itself (every command and option it registers), filled with
hostile values and the ids of real cards, runs, sessions and events. What would run unbounded
is kept out: ``serve``, ``web``, ``-f``/``--follow`` and a view's ``--watch`` are never generated,
``run`` always runs ``true``, the options that choose the config and state dir keep their test
values, and paths a command would create stay in the test's directory.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

from dispatcher.cli.main import build_parser, main
from tests.support import hostile
from tests.support.env import no_bus_env
from tests.support.wait import wait_for

CONFIG = """\
kanban:
  max_in_progress: 1
  assignees:
    worker:
      command: ["true"]
cron:
  jobs:
    - id: nightly
      schedule: "0 3 * * *"
      command: ["true"]
    - id: hourly
      every: 1h
      command: ["true"]
"""

PASS_THROUGH = {("run",), ("wait",), ("cron", "run")}
"""Commands that may exit with a worker's result (124 timed out, 127 failed_start)."""
NEVER = {("serve",), ("web",)}
"""Commands that run until stopped (``web``'s own bad input is in tests/test_web_http.py)."""
PINNED = ("--config", "--state-dir")
"""Global options the fuzz must not move (abbreviations included)."""
MAX_LINE = 1000


@dataclass(frozen=True, kw_only=True)
class Command:
    """One leaf of the parser: its words and options (with whether each takes a value)."""

    path: tuple[str, ...]
    options: tuple[tuple[str, bool], ...]


@dataclass(kw_only=True)
class World:
    """The private config, state dir and environment, and the ids found in them."""

    root: Path
    config: Path
    state: Path
    env: dict[str, str]
    ids: list[str] = field(default_factory=list)
    tried: int = 0
    exits: dict[int, int] = field(default_factory=dict)

    def argv(self, words: list[str]) -> list[str]:
        """``words`` behind the pinned ``--config`` and ``--state-dir``."""
        return ["--config", str(self.config), "--state-dir", str(self.state), *words]


def commands() -> list[Command]:
    """Every leaf command of the real parser, the ones in :data:`NEVER` left out."""
    found: list[Command] = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name))
                return
        options = tuple(
            (name, action.nargs != 0)
            for action in parser._actions
            for name in action.option_strings
            if name not in ("-h", *PINNED)
        )
        if path not in NEVER:
            found.append(Command(path=path, options=options))

    walk(build_parser(), ())
    return found


COMMANDS = commands()

values = st.one_of(
    hostile.any_text,
    hostile.os_text,
    hostile.huge_numbers,
    hostile.long_text,
    st.sampled_from(["", "-", "--", "-x", "--json", "--help", "-1", "0", "1", "5m", "c_", "s_"]),
    st.sampled_from(["0 0 29 2 */7", "* * * * *", "9999-12-30T00:00", "0001-01-01", "UTC"]),
    st.text(st.sampled_from(list("0123456789" + hostile.ODD_DIGITS)), min_size=1, max_size=6),
)


_numbers = hostile.mutated(st.integers(-5, 2000).map(str)) | hostile.huge_numbers
_durations = hostile.mutated(hostile.durations())
OPTION_VALUES: dict[str, st.SearchStrategy[str]] = {
    "--expr": hostile.crontab_text(),
    "--from": hostile.mutated(hostile.iso_times()),
    "--tz": hostile.mutated(st.sampled_from(hostile.ZONE_NAMES)),
    "--timeout": _durations,
    "--grace": _durations,
    "--heartbeat": _durations,
    "--env": st.tuples(st.sampled_from(["A", "_b", "1c", "", "A B"]), values).map("=".join),
    **dict.fromkeys(
        ["--count", "--limit", "--priority", "--failure-limit", "--max", "--tail", "--fires"],
        _numbers,
    ),
}
"""Values near each option's grammar (any option also gets the general hostile values)."""


@st.composite
def command_lines(draw: st.DrawFn, ids: list[str]) -> tuple[Command, list[str]]:
    """A command of the real parser with a few generated options and values."""
    command = draw(st.sampled_from(COMMANDS))
    value = st.one_of(values, hostile.mutated(st.sampled_from(ids))) if ids else values
    words = list(command.path)
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["option", "option", "value", "global"]))
        if kind == "option" and command.options:
            name, takes = draw(st.sampled_from(command.options))
            near = OPTION_VALUES.get(name)
            given = draw(st.one_of(near, near, value) if near is not None else value)
            words += [name, given] if takes else [name]
        elif kind == "global":
            words.append("--json")
        elif command.path != ("run",):
            words.append(draw(value))
    if command.path == ("run",):
        words += ["--", "true"]  # the only thing the fuzz ever runs
    return command, [w for w in words if not _unsafe(command, w)]


def _unsafe(command: Command, word: str) -> bool:
    """Words that would move the config or state dir, follow or redraw forever (``-f``,
    ``--follow``, a view's ``--watch``) or write outside the test's directory."""
    option = word.partition("=")[0]
    if len(option) > 2 and any(name.startswith(option) for name in PINNED):
        return True
    names = {name for name, _ in command.options}
    endless = [long for long, short in (("--follow", "-f"), ("--watch", "-w")) if short in names]
    for long in endless:
        short = long[2]
        if len(option) > 2 and long.startswith(option):
            return True
        if word.startswith("-") and not word.startswith("--") and short in word:
            return True
    return command.path == ("state", "backup") and word.startswith(("/", "~"))


def make_world(root: Path) -> World:
    """A config and an empty state dir under ``root``; call :func:`seed` from ``root``."""
    config = root / "config.yaml"
    config.write_text(CONFIG)
    return World(root=root, config=config, state=root / "state", env=no_bus_env(root))


def seed(world: World) -> None:
    """Cards, runs, sessions and events to aim real ids at."""
    first = _json(world, "kanban", "add", "first", "--assignee", "worker")["id"]
    _json(world, "kanban", "add", "second", "--assignee", "worker", "--parent", first)
    _json(world, "kanban", "tick")
    _json(world, "run", "--wait", "--notify", "--", "true")
    quiet(world)
    cards = _json(world, "kanban", "list", "--all")
    sessions = _json(world, "ps", "--all")
    events = _json(world, "events", "--all")
    world.ids = [c["id"] for c in cards] + [s["id"] for s in sessions]
    world.ids += [c["current_run_id"] for c in cards if c.get("current_run_id")]
    world.ids += [e["id"] for e in events] + ["nightly", "hourly", "worker"]
    world.ids += [i[:6] for i in world.ids]


def run_main(world: World, words: list[str]) -> tuple[int, str, str]:
    """``main`` in-process with the streams a real process has (stdout writes undecodable
    argv bytes back as bytes, like the console script; stderr escapes them). An exception
    escaping ``main`` propagates."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(world.argv(words), world.env)
            except SystemExit as exit_:  # --help and --version end argparse this way
                code = exit_.code if isinstance(exit_.code, int) else 0
    finally:
        sys.stdin = saved
    return code, _text(out), _text(err)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8", "surrogateescape")


def _json(world: World, *words: str) -> object:
    code, out, err = run_main(world, ["--json", *words])
    assert code == 0, (words, err)
    return json.loads(out)


def quiet(world: World) -> None:
    """Wait until no session runs (a worker finishing writes its exit record)."""
    wait_for(lambda: _json(world, "ps") == [], timeout=30)


def snapshot(state: Path) -> dict[str, bytes]:
    """Every file under ``state`` by its bytes (SQLite's ``-shm`` index left out)."""
    files = {}
    for path in sorted(state.rglob("*")):
        if path.is_file() and not path.is_symlink() and not path.name.endswith("-shm"):
            files[str(path.relative_to(state))] = path.read_bytes()
    return files


def problems(world: World, command: Command, words: list[str]) -> list[str]:
    """Run one command line; what it did wrong (empty: nothing). Kinds: ``crash``,
    ``exit``, ``lines``, ``long``, ``changed``; each entry starts with its kind."""
    quiet(world)
    before = snapshot(world.state)
    world.tried += 1
    try:
        code, _out, err = run_main(world, words)
    except Exception:  # the point of the fuzz: anything escaping main is a traceback
        return ["crash: " + traceback.format_exc(limit=-3)]
    world.exits[code] = world.exits.get(code, 0) + 1
    found = []
    allowed = {0, 1, 2} | ({124, 127} if command.path in PASS_THROUGH else set())
    if code not in allowed:
        found.append(f"exit: {code}: {err[:300]}")
    lines = err.splitlines()
    errors = sum("error:" in line for line in lines)
    # `config check` reports every error of a file, one line each (by design).
    if (errors > 1 and command.path != ("config", "check")) or any(
        not line.startswith("dispatch") for line in lines
    ):
        found.append(f"lines: {err[:300]!r}")
    if any(len(line) > MAX_LINE for line in lines):
        found.append(f"long: {max(len(line) for line in lines)} characters")
    if code == 2:
        quiet(world)
        after = snapshot(world.state)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        if changed:
            found.append(f"changed: {changed}")
    return found


@contextlib.contextmanager
def inside(root: Path):  # type: ignore[no-untyped-def]
    """Work from ``root``, so whatever a command creates by a relative name stays there."""
    cwd = os.getcwd()
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(cwd)
