"""argparse tuned to the CLI conventions: one-line usage errors with exit 2, global options
accepted before or after the subcommand."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from dispatcher.cli.groups import GROUPS
from scope.foundation.errors import UsageError


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are :class:`UsageError` (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's, except that a mistyped option is named even when argparse would
        first complain about a missing required argument (``kanban add --bogus x``)."""
        try:
            return super().parse_known_args(args, namespace)
        except UsageError:
            unknown = self._unknown_option(list(args or ())) if self._subparsers is None else None
            if unknown is None:
                raise
            raise UsageError(
                f"unrecognized argument: {unknown} (see '{self.prog} --help')"
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
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="config file (env DISPATCH_CONFIG; default $XDG_CONFIG_HOME/dispatch/config.yaml)",
    )
    group.add_argument(
        "--state-dir",
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
