"""`dispatch ps`: List registry sessions."""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from scope.errors import DispatchError

HELP = "List registry sessions."


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `ps` group."""
    parser = add_group(subparsers, "ps", common, help=HELP)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Not built yet."""
    raise DispatchError("'dispatch ps' is not available in this build yet")
