"""`dispatch wait`: Wait for a session to finish; exit with its result."""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from scope.errors import DispatchError

HELP = "Wait for a session to finish; exit with its result."


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `wait` group."""
    parser = add_group(subparsers, "wait", common, help=HELP)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Not built yet."""
    raise DispatchError("'dispatch wait' is not available in this build yet")
