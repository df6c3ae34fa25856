"""The command-line fast path: ``dispatch kanban add`` and a worker's reports without argparse.

Scripts add cards in loops and every worker reports at its end, so these five commands
(``kanban add``, ``complete``, ``block``, ``review``, ``defer``) should cost little more than
the interpreter's own start. :func:`recognise` reads their usual command lines with a small,
exact grammar and builds the namespace argparse would build, with the same handler
(:mod:`dispatcher.cli.kanban_writes`); the handler then reads the config snapshot
(:mod:`dispatcher.app.snapshot`) instead of config.yaml while the file is unchanged.

Anything else is left to argparse, which also words every usage error: another command,
``--help``, an abbreviated or unknown option, an option given twice (``--parent`` and
``--json`` may repeat), ``--opt=value`` on a flag, a value or positional argument that starts
with ``-`` (except ``-`` itself and whole negative numbers as values), ``--``, a missing or
extra argument, a number or choice out of range, a path argparse's checks refuse, text that
is not UTF-8. So it never accepts a command line argparse refuses, and what it accepts means
exactly what argparse makes of it (tests/test_cli_fastpath.py checks both, with Hypothesis).
``DISPATCH_FAST_PATH=0`` turns it off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import SimpleNamespace

from scope.foundation.errors import Invalid
from scope.foundation.text import parse_int

__all__ = ["COMMANDS", "GLOBAL", "Grammar", "path_problem", "recognise"]

PATH_MAX = 4096
NAME_MAX = 255

Kind = tuple[object, ...]
"""How an option's value is read: ``TEXT``, ``PATH``, ``APPEND`` (repeatable text, a list),
``FLAG`` (no value), ``("int", low, high)`` or ``("choice", *choices)``."""
TEXT: Kind = ("text",)
PATH: Kind = ("path",)
APPEND: Kind = ("append",)
FLAG: Kind = ("flag",)
PRIORITY_BOUNDS = (-(10**9), 10**9)
"""``--priority``: ``dispatcher.kanban.board.PRIORITY_RANGE``, which argparse is given (a copy:
the board is not imported to read a command line; a test compares them)."""
FAILURE_LIMIT_BOUNDS = (1, 10**6)
"""``--failure-limit``: ``dispatcher.kanban.board.FAILURE_LIMIT_RANGE``, likewise."""
BLOCK_KINDS = ("needs_input", "transient")
"""``block --kind``."""

GLOBAL: dict[str, tuple[str, Kind]] = {
    "--config": ("config", PATH),
    "--state-dir": ("state_dir", PATH),
    "--json": ("json", FLAG),
}
"""The global options by their spelling: (dest, kind). No defaults: argparse sets them only
when they are given."""


class Grammar:
    """One command's command line, as ``kanban_cmd.register`` declares it to argparse (a test
    compares the two). A plain class: ``dispatch --help`` imports this module and should not
    pay for dataclasses."""

    __slots__ = ("defaults", "exclusive", "one_of", "options", "positional", "required")

    def __init__(
        self,
        *,
        positional: tuple[str, bool],
        options: Mapping[str, tuple[str, Kind]],
        defaults: Mapping[str, object],
        required: tuple[str, ...] = (),
        exclusive: tuple[tuple[str, str], ...] = (),
        one_of: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.positional = positional
        """The positional argument: (dest, required); at most one is taken."""
        self.options = options
        """By spelling: (dest, kind)."""
        self.defaults = defaults
        """The value of each option's dest when it is not given."""
        self.required = required
        self.exclusive = exclusive
        """Pairs of dests that exclude each other."""
        self.one_of = one_of
        """Pairs of dests of which exactly one must be given."""


_RUN = {"--run": ("run", TEXT)}

COMMANDS: dict[str, Grammar] = {
    "add": Grammar(
        positional=("title", True),
        options={
            "--assignee": ("assignee", TEXT),
            "--body": ("body", TEXT),
            "--body-file": ("body_file", PATH),
            "--priority": ("priority", ("int", *PRIORITY_BOUNDS)),
            "--parent": ("parent", APPEND),
            "--idempotency-key": ("idempotency_key", TEXT),
            "--failure-limit": ("failure_limit", ("int", *FAILURE_LIMIT_BOUNDS)),
            "--group": ("card_group", TEXT),
        },
        defaults={
            "assignee": None,
            "body": None,
            "body_file": None,
            "priority": 0,
            "parent": [],
            "idempotency_key": None,
            "failure_limit": None,
            "card_group": None,
        },
        required=("assignee",),
        exclusive=(("body", "body_file"),),
    ),
    "complete": Grammar(
        positional=("id", False),
        options={**_RUN, "--result": ("result", TEXT)},
        defaults={"run": None, "result": None},
    ),
    "block": Grammar(
        positional=("id", False),
        options={
            **_RUN,
            "--kind": ("kind", ("choice", *BLOCK_KINDS)),
            "--reason": ("reason", TEXT),
        },
        defaults={"run": None, "kind": None, "reason": None},
        required=("kind", "reason"),
    ),
    "review": Grammar(positional=("id", False), options=_RUN, defaults={"run": None}),
    "defer": Grammar(
        positional=("id", False),
        options={
            **_RUN,
            "--for": ("for_", TEXT),
            "--until": ("until", TEXT),
            "--reason": ("reason", TEXT),
        },
        defaults={"run": None, "for_": None, "until": None, "reason": ""},
        one_of=(("for_", "until"),),
    ),
}
"""The fast path's commands (``dispatch kanban NAME``)."""


def recognise(argv: Sequence[str], environ: Mapping[str, str]) -> SimpleNamespace | None:
    """The parsed command line when it is one of the fast path's (see the module docstring),
    else None: argparse parses it."""
    if environ.get("DISPATCH_FAST_PATH") == "0":  # dispatcher.app.snapshot.BYPASS_ENV
        return None
    try:
        values = _values(list(argv))
    except (_Defer, UnicodeEncodeError):
        return None
    from dispatcher.cli import kanban_writes

    values["handler"] = getattr(kanban_writes, f"handle_{values['kanban_command']}")
    return SimpleNamespace(**values)


class _Defer(Exception):
    """Not for the fast path: argparse decides."""


def _values(argv: list[str]) -> dict[str, object]:
    for arg in argv:
        arg.encode("utf-8")  # UnicodeEncodeError for bytes that are not UTF-8 (surrogates)
    group: str | None = None
    grammar: Grammar | None = None
    found: dict[str, object] = {}
    positionals: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        if not arg.startswith("-"):
            if group is None and arg == "kanban":
                group = arg
            elif group is not None and grammar is None and arg in COMMANDS:
                grammar = COMMANDS[arg]
                found["kanban_command"] = arg
            elif grammar is not None:
                positionals.append(arg)
            else:
                raise _Defer
            continue
        name, equals, inline = arg.partition("=")
        known = GLOBAL.get(name) or (grammar.options.get(name) if grammar else None)
        if known is None:
            raise _Defer
        dest, kind = known
        if kind == FLAG:
            if equals:
                raise _Defer
            found[dest] = True
            continue
        if dest in found and kind != APPEND:
            raise _Defer
        if equals:
            value = inline
        elif index < len(argv) and _is_value(argv[index]):
            value = argv[index]
            index += 1
        else:
            raise _Defer
        if kind == APPEND:
            listed = found.setdefault(dest, [])
            assert isinstance(listed, list)
            listed.append(value)
        else:
            found[dest] = _convert(value, kind)
    if grammar is None:
        raise _Defer
    return _namespace(grammar, found, positionals)


def _is_value(arg: str) -> bool:
    """Whether argparse takes ``arg`` as an option's value: ``-`` and whole negative numbers
    count (no option of ours looks like one); anything else that starts with ``-`` is left
    to argparse."""
    if not arg.startswith("-") or arg == "-":
        return True
    return arg[1:].isascii() and arg[1:].isdigit()


def _convert(value: str, kind: Kind) -> object:
    if kind == PATH and path_problem(value) is not None:
        raise _Defer
    if kind[0] == "int":
        low, high = kind[1], kind[2]
        assert isinstance(low, int) and isinstance(high, int)
        try:
            return parse_int(value, low=low, high=high)
        except Invalid:
            raise _Defer from None
    if kind[0] == "choice" and value not in kind[1:]:
        raise _Defer
    return value


def _namespace(
    grammar: Grammar, found: dict[str, object], positionals: list[str]
) -> dict[str, object]:
    dest, required = grammar.positional
    if len(positionals) > 1 or (required and not positionals):
        raise _Defer
    if any(name not in found for name in grammar.required):
        raise _Defer
    if any(first in found and second in found for first, second in grammar.exclusive):
        raise _Defer
    if any((first in found) == (second in found) for first, second in grammar.one_of):
        raise _Defer
    values: dict[str, object] = {"command": "kanban", "group": "kanban"}
    values.update({k: list(v) if isinstance(v, list) else v for k, v in grammar.defaults.items()})
    values[dest] = positionals[0] if positionals else None
    values.update(found)
    return values


def path_problem(text: str) -> str | None:
    """Why ``text`` cannot name a file or directory (a NUL byte, longer than the kernel
    allows: 4096 bytes, 255 per name), or None. ``dispatcher.cli.parser.path_arg`` refuses
    the same."""
    if "\0" in text:
        return "contains a NUL byte; give a real path"
    raw = os.fsencode(text)
    if len(raw) >= PATH_MAX or any(len(part) > NAME_MAX for part in raw.split(b"/")):
        return f"is longer than a path can be ({PATH_MAX} bytes, {NAME_MAX} per name)"
    return None
