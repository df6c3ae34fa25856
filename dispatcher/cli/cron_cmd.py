"""`dispatch cron`: Cron jobs: list, next, run, history, pause, resume."""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from scope.errors import DispatchError

HELP = "Cron jobs: list, next, run, history, pause, resume."


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `cron` group."""
    parser = add_group(subparsers, "cron", common, help=HELP)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Not built yet."""
    raise DispatchError("'dispatch cron' is not available in this build yet")
