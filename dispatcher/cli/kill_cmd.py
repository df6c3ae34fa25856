"""`dispatch kill`: Kill a session (scope stop or process-group SIGTERM, grace, SIGKILL)."""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from scope.errors import DispatchError

HELP = "Kill a session (scope stop or process-group SIGTERM, grace, SIGKILL)."


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `kill` group."""
    parser = add_group(subparsers, "kill", common, help=HELP)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Not built yet."""
    raise DispatchError("'dispatch kill' is not available in this build yet")
