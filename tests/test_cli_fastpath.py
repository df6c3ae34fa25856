"""The short write commands' fast path (issue 26) behaves exactly like the full path.

- The command-line recogniser (``dispatcher/cli/fastpath.py``) never accepts what argparse
  refuses, and what it accepts parses to argparse's namespace (Hypothesis, against the real
  parser), and its grammar is the one ``kanban_cmd`` declares to argparse.
- Differential: every case runs through the fast path (the recogniser and a current config
  snapshot) and through the full path (``DISPATCH_FAST_PATH=0``: argparse and config.yaml) on
  copies of the same state dir, with the same clock and ids; output, exit status and every
  board and outbox row must be equal, error cases included (bad priority, unknown parent,
  missing title, unknown and ambiguous card ids, a stale run, a broken config, ...).

The commands run in this process through ``dispatcher.cli.main.main`` (what the console script
calls), so the whole matrix takes seconds; ``tests/test_cli_snapshot.py`` runs the real
console command for the snapshot's file-level promises.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import shutil
import sqlite3
import string
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.app.database import open_state
from dispatcher.cli import fastpath
from dispatcher.cli.main import build_parser, main, parse
from dispatcher.kanban import board
from dispatcher.kanban.model import Limits, NewCard
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant
from scope.foundation.clock import SystemClock
from scope.foundation.errors import DispatchError
from scope.foundation.ids import IdKind

NOW = 1_800_000_000.0
CONFIG = """\
kanban:
  transient_block: 90s
  assignees:
    w: {command: [sh, -c, ':']}
    v: {command: [sh, -c, ':']}
notify:
  channels:
    out: {command: [cat]}
  rules:
    - {on: [card.added, card.done, card.review, card.blocked, card.deferred], to: [out]}
"""

# -- the recogniser against argparse ----------------------------------------------------------

WORDS = [
    "kanban", "add", "complete", "block", "review", "defer", "list", "ps", "x", "", "t i t",
    "c_1234", "r_12345", "w", "5m", "2030-01-01T00:00", "needs_input", "transient", "bogus",
    "-", "--", "-5", "-1.5", "5", "0", "1", "1000000", "1000001", "1000000000", "1000000001",
    "-1000000000", "-1000000001", "-h", "--help", "--version",
    "-x y", "\udcff", "a=b",
]  # fmt: skip
OPTIONS = [
    "--assignee", "--body", "--body-file", "--priority", "--parent", "--idempotency-key",
    "--failure-limit", "--run", "--result", "--kind", "--reason", "--for", "--until",
    "--config", "--state-dir", "--json", "--assign", "--js", "--nope", "-w",
]  # fmt: skip
WORD = st.one_of(st.sampled_from(WORDS), st.text(string.printable, max_size=6))
# A unit is one token or an option with its value (two tokens, or one with "=").
UNIT = st.one_of(
    WORD.map(lambda word: [word]),
    st.sampled_from(OPTIONS).map(lambda option: [option]),
    st.tuples(st.sampled_from(OPTIONS), WORD).map(list),
    st.tuples(st.sampled_from(OPTIONS), WORD).map(lambda pair: ["=".join(pair)]),
)
TOKENS = st.lists(UNIT, max_size=6).map(lambda units: [t for unit in units for t in unit])
# Mostly command lines that start like a fast-path command, so most examples get far.
GLOBALS = st.lists(
    st.sampled_from([["--json"], ["--config", "c.yaml"], ["--state-dir=s"], ["--config"]]),
    max_size=2,
)


def _value(kind: tuple[object, ...]) -> st.SearchStrategy[str]:
    """Values for an option of ``kind``: near its bounds or choices, or any word."""
    if kind[0] == "int":
        low, high = int(str(kind[1])), int(str(kind[2]))
        edges = st.sampled_from([low - 1, low, 0, high, high + 1]).map(str)
        return st.one_of(edges, edges, edges, WORD)
    if kind[0] == "choice":
        return st.one_of(st.sampled_from([str(c) for c in kind[1:]]), WORD)
    return WORD


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    """A fast-path command with each of its options given or not (required ones mostly
    given), values near their limits, stray units, in any order, after global options."""
    name = draw(st.sampled_from(sorted(fastpath.COMMANDS)))
    grammar = fastpath.COMMANDS[name]
    units: list[list[str]] = []
    if grammar.positional[1] or draw(st.booleans()):
        units.append([draw(WORD)])
    for spelling, (dest, kind) in grammar.options.items():
        if draw(st.integers(0, 9)) < (9 if dest in grammar.required else 4):
            value = draw(_value(kind))
            units.append(draw(st.sampled_from([[spelling, value], [f"{spelling}={value}"]])))
    if draw(st.integers(0, 3)) == 0:
        units.append(draw(UNIT))
    order = draw(st.permutations(units))
    head = draw(GLOBALS)
    return [*(t for unit in head for t in unit), "kanban", name, *(t for u in order for t in u)]


ARGV = st.one_of(TOKENS, command_lines())


def _argparse(argv: list[str]) -> dict[str, Any] | None:
    """What argparse makes of ``argv`` (None: refused, or it printed help or the version)."""
    try:
        return vars(parse(argv))
    except (DispatchError, SystemExit):
        return None


# Ten times the profile's examples (400 by default, derandomized in CI): most command lines are
# deferred at once, and the few that reach argparse are what the property is about.
@settings(
    max_examples=settings.default.max_examples * 10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ARGV)
def test_the_recogniser_accepts_only_what_argparse_accepts_and_reads_it_alike(
    argv: list[str],
) -> None:
    fast = fastpath.recognise(argv, {})
    if fast is None:
        return  # deferred: argparse decides, as without the fast path
    assert _argparse(argv) == vars(fast), argv


@pytest.mark.parametrize(
    "argv",
    [
        ["kanban", "add", "a title", "--assignee", "w"],
        ["--config", "c.yaml", "--state-dir", "s", "kanban", "add", "t", "--assignee=w"],
        ["kanban", "--json", "add", "--assignee", "w", "--parent", "c_1", "t", "--parent=c_2"],
        ["kanban", "add", "t", "--assignee", "w", "--priority", "-5", "--body-file", "-"],
        ["kanban", "add", "t", "--assignee", "w", "--idempotency-key", "k", "--failure-limit", "3"],
        ["kanban", "complete"],
        ["kanban", "complete", "c_1234", "--run", "r_1234", "--result", "fine", "--json"],
        ["kanban", "block", "--kind", "transient", "--reason", "later"],
        ["kanban", "review", "--run=r_1234"],
        ["kanban", "defer", "--for", "5m", "--reason", "busy"],
        ["kanban", "defer", "c_1234", "--until", "2030-01-01T09:00"],
    ],
)
def test_the_usual_command_lines_take_the_fast_path(argv: list[str]) -> None:
    fast = fastpath.recognise(argv, {})
    assert fast is not None
    assert vars(fast) == _argparse(argv)
    assert fastpath.recognise(argv, {"DISPATCH_FAST_PATH": "0"}) is None


def test_the_grammar_is_the_one_argparse_is_given() -> None:
    kanban = _subparsers(build_parser(["kanban"]))["kanban"]
    commands = _subparsers(kanban)
    globals_ = {"--config", "--state-dir", "--json", "-h", "--help"}
    for name, grammar in fastpath.COMMANDS.items():
        actions = commands[name]._actions
        options = {
            spelling: action
            for action in actions
            for spelling in action.option_strings
            if spelling not in globals_
        }
        assert set(options) == set(grammar.options), name
        for spelling, (dest, kind) in grammar.options.items():
            action = options[spelling]
            assert action.dest == dest, spelling
            assert action.default == grammar.defaults[dest], spelling
            assert action.required == (dest in grammar.required), spelling
            if kind[0] == "choice":
                assert list(action.choices or ()) == list(kind[1:]), spelling
            if kind[0] == "int":
                low, high = kind[1], kind[2]
                assert isinstance(low, int) and isinstance(high, int)
                assert action.type(str(low)) == low and action.type(str(high)) == high
                for outside in (low - 1, high + 1):
                    with pytest.raises(argparse.ArgumentTypeError):
                        action.type(str(outside))
        (positional,) = [a for a in actions if not a.option_strings]
        assert (positional.dest, positional.nargs != "?") == grammar.positional, name
    assert set(fastpath.COMMANDS) <= set(commands)
    # The fast path's copies of the board's bounds (it must not import the board to parse).
    assert fastpath.PRIORITY_BOUNDS == board.PRIORITY_RANGE
    assert fastpath.FAILURE_LIMIT_BOUNDS == board.FAILURE_LIMIT_RANGE


def _subparsers(parser: Any) -> dict[str, Any]:
    (action,) = [a for a in parser._actions if a.choices and hasattr(a, "add_parser")]
    return dict(action.choices)


# -- fast path and full path, differential ----------------------------------------------------


class Ids:
    """Deterministic card, run and message ids: the same sequence for both paths of a case."""

    def __init__(self) -> None:
        self.reset(1)

    def reset(self, start: int) -> None:
        self.counter = itertools.count(start)

    def new(self, kind: IdKind) -> str:
        return f"{kind.prefix}{next(self.counter):0{kind.digits}x}"

    def uuid4(self) -> uuid.UUID:
        return uuid.UUID(int=next(self.counter))


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A board with a parent card, two cards whose ids share a prefix and four running cards
    (one per worker report), a current config snapshot, and a fixed clock and id sequence."""
    ids = Ids()
    monkeypatch.setattr(IdKind, "new", lambda kind: ids.new(kind))
    monkeypatch.setattr(SystemClock, "time", lambda self: NOW)
    monkeypatch.setattr(uuid, "uuid4", ids.uuid4)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    state = tmp_path / "state"
    db = open_state(state)
    store = SqliteBoardStore(db)
    cards = {}
    for title in ("parent", "twin-a", "twin-b"):
        cards[title] = store.add_card(NewCard(title=title, assignee="w"), now=NOW - 50)[0].id
    runs = {}
    claimant = Claimant(pid=1, start=1, boot="b")
    for report in ("complete", "block", "review", "defer"):
        card = store.add_card(NewCard(title=report, assignee="w"), now=NOW - 40)[0]
        claim = store.claim(
            card.id, now=NOW - 30, claimer=claimant, limits=Limits(max_in_progress=9)
        )
        assert claim.run is not None
        cards[report], runs[report] = card.id, claim.run.run_id
    db.close()
    base = {"DISPATCH_CONFIG": str(config), "DISPATCH_STATE_DIR": str(state), "TZ": "UTC"}
    # One add leaves the config snapshot behind, as a first command would.
    assert (
        main(["kanban", "add", "warm-up", "--assignee", "w", "--idempotency-key", "k"], base) == 0
    )
    assert (state / "cache").is_dir()
    yield {
        "tmp": tmp_path,
        "config": config,
        "state": state,
        "cards": cards,
        "runs": runs,
        "base": base,
        "ids": ids,
        "monkeypatch": monkeypatch,
    }


TABLES = (
    "kanban_cards",
    "kanban_parents",
    "kanban_events",
    "kanban_meta",
    "kanban_runs",
    "notify_outbox",
)


def _dump(state: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row that a short write command may change."""
    conn = sqlite3.connect(state / "state.db")
    try:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
            for table in TABLES
        }
    finally:
        conn.close()


def _run(
    world: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    label: str,
    argv: list[str],
    env: dict[str, str],
) -> tuple[int, str, str, dict[str, list[tuple[Any, ...]]]]:
    """``argv`` on a copy of the world's state dir; its exit status, output and rows."""
    copy = world["tmp"] / label
    shutil.copytree(world["state"], copy)
    world["ids"].reset(1000)
    capsys.readouterr()
    status = main(argv, {**world["base"], "DISPATCH_STATE_DIR": str(copy), **env})
    out, err = capsys.readouterr()
    return status, out, err.replace(str(copy), "STATE"), _dump(copy)


CASES = [
    ("add", "kanban add t --assignee w"),
    ("add json", "--json kanban add ' t ' --assignee=v --priority -3"),
    (
        "add parents",
        "kanban add c --assignee w --parent {parent} --parent {twin-a} --parent {parent}",
    ),
    (
        "add key",
        "kanban add k --assignee w --idempotency-key key --body 'b\nody' --failure-limit 2",
    ),
    ("add same key", "kanban add other --assignee nobody --idempotency-key k"),
    ("bad priority", "kanban add t --assignee w --priority high"),
    ("priority out of range", "kanban add t --assignee w --priority 1000000001"),
    ("unknown parent", "kanban add t --assignee w --parent c_ffff"),
    ("short parent", "kanban add t --assignee w --parent c_"),
    ("ambiguous parent", "kanban add t --assignee w --parent c_0000"),
    ("missing title", "kanban add --assignee w"),
    ("empty title", "kanban add '' --assignee w"),
    ("title with a line break", "kanban add 'a\nb' --assignee w"),
    ("unknown assignee", "kanban add t --assignee nobody"),
    ("missing body file", "kanban add t --assignee w --body-file {tmp}/none"),
    ("missing config", "--config {tmp}/none.yaml kanban add t --assignee w"),
    ("complete", "kanban complete {complete} --run {run-complete} --result fine"),
    ("complete json", "kanban complete {complete} --run {run-complete} --json"),
    ("complete as a worker", "kanban complete", "complete"),
    ("complete, stale run", "kanban complete {complete} --run {run-review}"),
    ("complete, bad run id", "kanban complete {complete} --run x"),
    ("complete, no run", "kanban complete {complete}"),
    ("complete, no card", "kanban complete"),
    ("unknown card", "kanban complete c_fffffffff0 --run {run-complete}"),
    ("ambiguous card", "kanban review c_0000 --run {run-review}"),
    ("short card", "kanban review c_ --run {run-review}"),
    ("block transient", "kanban block {block} --run {run-block} --kind transient --reason wait"),
    ("block json", "kanban block {block} --run {run-block} --kind needs_input --reason a --json"),
    ("block, bad kind", "kanban block {block} --run {run-block} --kind later --reason r"),
    ("block, empty reason", "kanban block {block} --run {run-block} --kind transient --reason ' '"),
    ("review", "kanban review {review} --run {run-review}"),
    ("defer", "kanban defer {defer} --run {run-defer} --for 1h30m --reason busy"),
    ("defer until", "kanban defer {defer} --run {run-defer} --until 2030-01-01T09:00 --json"),
    ("defer, past", "kanban defer {defer} --run {run-defer} --until 2020-01-01T09:00"),
    ("defer, bad duration", "kanban defer {defer} --run {run-defer} --for soon"),
    ("defer, both", "kanban defer --for 1m --until 2030-01-01"),
    ("defer as a worker", "kanban defer --for 2h --reason later", "defer"),
    ("block as a worker", "kanban block --kind transient --reason wait", "block"),
]
"""(label, command line[, worker]): ``{card}`` and ``{run-card}`` name the world's cards and
runs; a third item runs the command in the environment of that card's worker (its run, card
and a host id)."""


def _cases(world: dict[str, Any]) -> list[tuple[str, list[str], dict[str, str]]]:
    names = {**world["cards"], **{f"run-{k}": v for k, v in world["runs"].items()}}
    names["tmp"] = str(world["tmp"])

    def worker(card: str) -> dict[str, str]:
        runs, cards = world["runs"], world["cards"]
        return {
            "DISPATCH_RUN_ID": runs[card],
            "DISPATCH_HOST_ID": "h",
            "DISPATCH_CARD_ID": cards[card],
        }

    return [
        (label, shlex.split(line.format_map(names)), worker(extra[0]) if extra else {})
        for label, line, *extra in CASES
    ]


def test_fast_and_full_paths_agree(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    calls = {"parse": 0, "config": 0}
    monkeypatch: pytest.MonkeyPatch = world["monkeypatch"]
    _count(monkeypatch, calls, "dispatcher.cli.main.parse", "parse")
    _count(monkeypatch, calls, "dispatcher.config.load_config", "config")
    fast_ones = 0
    for label, argv, env in _cases(world):
        before = dict(calls)
        fast = _run(world, capsys, f"{label}-fast", argv, env)
        took_fast_path = calls == before
        full = _run(world, capsys, f"{label}-full", argv, {**env, "DISPATCH_FAST_PATH": "0"})
        assert fast == full, label
        fast_ones += took_fast_path
        if fastpath.recognise(argv, {}) is not None:
            assert took_fast_path, f"{label}: left the fast path"
    assert fast_ones >= 25


def test_a_broken_config_reads_the_same_on_both_paths(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The snapshot of the good file is not used once the file changed: an operator's add or
    defer reports the config error (exit 2), a worker's report lands without a word."""
    world["config"].write_text(CONFIG + "  bogus: [\n")
    cards, runs = world["cards"], world["runs"]
    worker = {"DISPATCH_RUN_ID": runs["review"], "DISPATCH_HOST_ID": "h"}
    deferring = {"DISPATCH_RUN_ID": runs["defer"], "DISPATCH_HOST_ID": "h"}
    cases = [
        (["kanban", "add", "t", "--assignee", "w"], {}),
        (["kanban", "review", cards["review"]], worker),
        (["kanban", "defer", cards["defer"], "--for", "1m"], deferring),
        (["kanban", "defer", cards["defer"], "--run", runs["defer"], "--for", "1m"], {}),
    ]
    results = []
    for number, (argv, env) in enumerate(cases):
        fast = _run(world, capsys, f"broken-{number}-fast", argv, env)
        full = _run(
            world, capsys, f"broken-{number}-full", argv, {**env, "DISPATCH_FAST_PATH": "0"}
        )
        assert fast == full, argv
        results.append(fast)
    added, reviewed, deferred, operator_deferred = results
    assert added[0] == 2 and added[2].count("\n") == 1 and "config.yaml:" in added[2]
    assert reviewed[:3] == (0, f"{cards['review']} in review\n", "")
    assert deferred[0] == 0 and deferred[2] == ""
    assert operator_deferred[0] == 2 and "invalid YAML" in operator_deferred[2]


def _count(monkeypatch: pytest.MonkeyPatch, calls: dict[str, int], target: str, key: str) -> None:
    module_name, _, name = target.rpartition(".")
    module = __import__(module_name, fromlist=[name])
    real = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[key] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
