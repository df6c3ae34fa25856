"""``dispatch manpage``: print the ``dispatch(1)`` man page, generated from the parser.

Install once: ``dispatch manpage > ~/.local/share/man/man1/dispatch.1`` (then ``man dispatch``;
system-wide ``/usr/local/share/man/man1/dispatch.1``).
"""

from __future__ import annotations

import argparse

from dispatcher.cli.completion import manpage, print_text
from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the ``manpage`` command."""
    parser = add_group(
        subparsers,
        "manpage",
        common,
        description="Print the dispatch(1) man page (roff) on stdout, generated from the same "
        "parser as --help. Install it with "
        "'dispatch manpage > ~/.local/share/man/man1/dispatch.1', then 'man dispatch'.",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Print the page."""
    print_text(manpage())
    return 0
