"""`dispatch logs`: Print a session's output log (raw bytes)."""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from scope.errors import DispatchError

HELP = "Print a session's output log (raw bytes)."


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `logs` group."""
    parser = add_group(subparsers, "logs", common, help=HELP)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Not built yet."""
    raise DispatchError("'dispatch logs' is not available in this build yet")
