"""`dispatch kanban`: Kanban board: add, list, show, tick, complete, block, ..."""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from scope.errors import DispatchError

HELP = "Kanban board: add, list, show, tick, complete, block, ..."


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `kanban` group."""
    parser = add_group(subparsers, "kanban", common, help=HELP)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Not built yet."""
    raise DispatchError("'dispatch kanban' is not available in this build yet")
