"""argparse tuned to the CLI conventions: one-line usage errors with exit 2, global options
accepted before or after the subcommand, user text quoted safely in errors, ASCII numbers, and
text arguments that must be valid UTF-8."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from dispatcher.cli.fastpath import path_problem
from dispatcher.cli.groups import GROUPS
from scope.foundation.errors import Invalid, UsageError
from scope.foundation.text import QUOTE_LIMIT, parse_int, quote

BYTES_OK = frozenset({"config", "state_dir", "cwd", "body_file", "file", "unit", "command"})
"""Destinations that take paths or a command's words: bytes that are not UTF-8 (which reach
Python as lone surrogates) are legitimate there and passed on unchanged. Every other text
argument must be UTF-8, because it is stored, matched or shown as text."""

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs the CLI's start-up
    from typing import Any, NoReturn


class Formatter(argparse.HelpFormatter):
    """argparse's formatter, minus its ``import shutil`` (bz2, lzma, zlib ...) at every
    ``add_argument``: the width comes from ``COLUMNS`` or the terminal as shutil would."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        super().__init__(prog, indent_increment, max_help_position, width or _columns() - 2)


def _columns() -> int:
    try:
        return max(int(os.environ.get("COLUMNS", "")), 20)
    except ValueError:
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are :class:`UsageError` (one line, exit 2)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    _seen: Sequence[str] = ()

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{safe_message(message, self._seen)} (see '{self.prog} --help')")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's, except that a mistyped option is named even when argparse would
        first complain about a missing required argument (``kanban add --bogus x``)."""
        self._seen = list(args or ())  # for error(): argparse repeats raw arguments
        try:
            return super().parse_known_args(args, namespace)
        except UsageError:
            unknown = self._unknown_option(list(args or ())) if self._subparsers is None else None
            if unknown is None:
                raise
            raise UsageError(
                f"unrecognized argument: {safe_message(unknown, [unknown])} "
                f"(see '{self.prog} --help')"
            ) from None

    def _unknown_option(self, args: list[str]) -> str | None:
        known = self._option_string_actions
        for arg in args:
            if arg == "--":
                return None
            if not arg.startswith("-") or arg == "-" or _is_number(arg):
                continue
            name = arg.split("=", 1)[0]
            if name in known or (
                name.startswith("--") and sum(o.startswith(name) for o in known) == 1
            ):
                continue
            if not name.startswith("--") and name[:2] in known:
                continue  # -n5 style: a short option with its value attached
            return arg
        return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class Version(argparse.Action):
    """``--version`` without argparse's help formatter."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from dispatcher import __version__

        sys.stdout.write(f"dispatch {__version__}\n")
        parser.exit()


# The type of add_subparsers()'s result; only subscriptable for the type checker on 3.11.
if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[Parser]
else:
    Subparsers = argparse._SubParsersAction


def global_options() -> Parser:
    """The options every (sub)command accepts, in any position.

    Defaults are suppressed so that a value given before the subcommand is not overwritten by
    the subparser's default; :func:`main` fills in the real defaults afterwards."""
    common = Parser(add_help=False)
    group = common.add_argument_group("global options")
    group.add_argument(
        "--config",
        type=path_arg,
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="config file (env DISPATCH_CONFIG; default $XDG_CONFIG_HOME/dispatch/config.yaml)",
    )
    group.add_argument(
        "--state-dir",
        type=path_arg,
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="state directory (env DISPATCH_STATE_DIR; default $XDG_STATE_HOME/dispatch)",
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print one JSON document on stdout",
    )
    return common


def add_group(
    subparsers: Subparsers,
    name: str,
    common: Parser,
    help: str | None = None,
    description: str | None = None,
) -> Parser:
    """Add a subcommand group that takes the global options (help from :data:`GROUPS`)."""
    text = help or GROUPS[name]
    parser = subparsers.add_parser(
        name, help=text, description=description or text, parents=[common]
    )
    parser.set_defaults(group=name)
    return parser


def add_subgroups(parser: Parser, dest: str) -> Subparsers:
    """Sub-subcommands (``dispatch cron list``); one of them is required."""
    subs = parser.add_subparsers(dest=dest, metavar="COMMAND", parser_class=Parser)
    subs.required = True
    return subs


def int_arg(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` for a whole number in ASCII digits within ``low``..``high``
    (``int`` would take Arabic-Indic digits, ``1_000`` and 5,000-digit numbers)."""

    def integer(text: str) -> int:
        try:
            return parse_int(text, low=low, high=high)
        except Invalid as err:
            raise argparse.ArgumentTypeError(err.problem) from None

    return integer


def path_arg(text: str) -> str:
    """An argparse ``type=`` for a file or directory name: any bytes but NUL, within the
    kernel's limits (4096 bytes, 255 per name), so no later ``stat`` fails on the name itself."""
    problem = path_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{quote(text)} {problem}")
    return text


def check_text_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """UsageError naming the first text argument that holds bytes that are not UTF-8 (see
    :data:`BYTES_OK` for the arguments that may)."""
    for dest, value in vars(args).items():
        if dest not in BYTES_OK and _undecodable(value):
            name = _option_names(parser).get(dest, dest)
            raise UsageError(
                f"argument {name}: contains bytes that are not UTF-8",
                remedy="give the value as UTF-8 text",
            )


def safe_message(message: str, seen: Sequence[str]) -> str:
    """``message`` with every long or unprintable argument of ``seen`` that it repeats
    replaced by a short escaped quote (argparse echoes values whole: a 100 KB value, a 100 KB
    line)."""
    risky: set[str] = set()
    for arg in seen:
        for piece in (arg, arg.partition("=")[2]):
            if len(piece) > QUOTE_LIMIT or (piece and not piece.isprintable()):
                risky.add(piece)
    for piece in sorted(risky, key=len, reverse=True):
        message = message.replace(repr(piece), quote(piece)).replace(piece, quote(piece))
    return message


def _undecodable(value: object) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, list | tuple):
        return any(_undecodable(item) for item in value)
    return False


def _option_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Destination -> how the user spells it (``--title``, ``TITLE``), subcommands included."""
    names: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for dest, name in _option_names(sub).items():
                    names.setdefault(dest, name)
        elif action.option_strings:
            names.setdefault(action.dest, action.option_strings[-1])
        else:
            names.setdefault(action.dest, str(action.metavar or action.dest))
    return names
