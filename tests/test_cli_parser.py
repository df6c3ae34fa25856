"""The argument parser as a whole: help for every action, usage errors that name the problem
and point at the innermost command's help (issue 14, defect 5)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from dispatcher.cli.main import build_parser, main


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("dispatch",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the CLI with its command path."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


def test_every_command_and_every_argument_has_help() -> None:
    missing = []
    for path, parser in walk(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                missing += [f"{' '.join(path)} {n}" for n in action.choices if not helps.get(n)]
            elif not action.help:
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, "no help text: " + ", ".join(missing)


def test_the_lazy_parser_has_the_same_commands_as_the_full_one() -> None:
    full = {path for path, _ in walk(build_parser())}
    for group in {path[1] for path in full if len(path) > 1}:
        lazy = {path for path, _ in walk(build_parser([group])) if path[1:2] == (group,)}
        assert lazy == {path for path in full if path[1:2] == (group,)}, group


@pytest.mark.parametrize(
    ("argv", "needle", "pointer"),
    [
        (["--bogus"], "unrecognized argument: --bogus", "dispatch --help"),
        (["--bogus", "ps"], "unrecognized arguments: --bogus", "dispatch ps --help"),
        (
            ["kanban", "add", "--bogus", "x"],
            "unrecognized argument: --bogus",
            "dispatch kanban add",
        ),
        (["kanban", "add"], "required: TITLE", "dispatch kanban add --help"),
        (["kanban", "list", "--bogus"], "--bogus", "dispatch kanban list --help"),
        (["ps", "--bogus"], "--bogus", "dispatch ps --help"),
        (["run", "--bogus", "--", "true"], "--bogus", "dispatch run --help"),
        (["status", "--fires", "-3"], "--fires", "dispatch status --help"),
        (["kanban"], "required: COMMAND", "dispatch kanban --help"),
        (["bogus"], "invalid choice: 'bogus'", "dispatch --help"),
    ],
)
def test_usage_errors_name_the_problem_and_the_innermost_help(
    argv: list[str], needle: str, pointer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv, environ={}) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert needle in err and f"(see '{pointer}" in err, err
