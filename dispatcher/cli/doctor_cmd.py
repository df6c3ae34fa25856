"""`dispatch doctor`:

Check the systemd user bus, manager and probe; explain placement and remedies."""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from scope.errors import DispatchError

HELP = "Check the systemd user bus, manager and probe; explain placement and remedies."


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `doctor` group."""
    parser = add_group(subparsers, "doctor", common, help=HELP)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Not built yet."""
    raise DispatchError("'dispatch doctor' is not available in this build yet")
