"""`dispatch events`: List, follow and acknowledge completion events."""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from scope.errors import DispatchError

HELP = "List, follow and acknowledge completion events."


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `events` group."""
    parser = add_group(subparsers, "events", common, help=HELP)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Not built yet."""
    raise DispatchError("'dispatch events' is not available in this build yet")
