"""Entry point of the ``dispatch`` command.

Each subcommand group lives in its own module exposing ``register(subparsers, common)``; the
handler a module installs with ``set_defaults(handler=...)`` receives ``(args, ctx)`` and returns
the exit status. Errors derived from :class:`~scope.foundation.errors.DispatchError` become one
line on stderr and their class's exit code; anything else is a bug and shows a traceback.
"""

from __future__ import annotations

import importlib
import logging
import os
import sqlite3
import sys
from collections.abc import Mapping, Sequence

from dispatcher import __version__
from dispatcher.cli.context import Context
from dispatcher.cli.groups import GROUPS, chosen_group
from dispatcher.cli.parser import Parser, global_options
from scope.foundation.errors import DispatchError
from scope.foundation.text import one_line

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_RESTART = 75


def build_parser(argv: Sequence[str] | None = None) -> Parser:
    """The argument parser for ``argv``.

    Only the group ``argv`` names is imported and registered in full; the others are one-line
    placeholders, so start-up stays cheap and ``--help`` still lists every group. Without
    ``argv`` every group is registered (for documentation and tests)."""
    common = global_options()
    parser = Parser(
        prog="dispatch",
        description="Kanban/cron worker dispatcher with restart-safe systemd scoping.",
        parents=[common],
        epilog="Exit codes: 0 ok, 1 failed/unhealthy, 2 usage or config error, "
        "75 serve asks for a restart. Docs: docs/ in the source tree.",
    )
    parser.add_argument("--version", action="version", version=f"dispatch {__version__}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    subs.required = True
    wanted = None if argv is None else chosen_group(list(argv))
    for name, help_text in GROUPS.items():
        if argv is None or name == wanted:
            module = importlib.import_module(f"dispatcher.cli.{name}_cmd")
            module.register(subs, common)
        else:
            subs.add_parser(name, help=help_text, add_help=False)
    return parser


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run the CLI; returns the exit status (the console script exits with it)."""
    environ = os.environ if environ is None else environ
    ctx: Context | None = None
    handler = _diagnostics_handler()
    try:
        arguments = list(sys.argv[1:] if argv is None else argv)
        args = build_parser(arguments).parse_args(arguments)
        ctx = Context(args, environ)
        status = args.handler(args, ctx)
        return int(status or 0)
    except DispatchError as err:
        print(f"dispatch: error: {one_line(err.message)}", file=sys.stderr)
        return err.exit_code
    except sqlite3.DatabaseError as err:
        # Store queries raise sqlite3 errors for a damaged or foreign database: one line, no
        # traceback (the state module translates what it can foresee; this is the backstop).
        print(f"dispatch: error: state database: {err}; check --state-dir", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("dispatch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (| head): not an error worth a traceback.
        _silence_stdout()
        return EXIT_FAILED
    finally:
        if ctx is not None:
            ctx.close()
        logging.getLogger("dispatch").removeHandler(handler)


class _Diagnostics(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage().replace("\n", " | ")
        return f"dispatch: {record.levelname.lower()}: {text}"


def _diagnostics_handler() -> logging.Handler:
    """Warnings from the library (a degraded placement, a lost session) as one line each on
    stderr; ``dispatch serve`` replaces this with its own journal-friendly handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_Diagnostics())
    handler.dispatch_cli = True  # type: ignore[attr-defined]
    logger = logging.getLogger("dispatch")
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.WARNING:
        logger.setLevel(logging.WARNING)
    return handler


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except OSError:
        pass


def entry() -> None:
    """Console-script entry: exit with :func:`main`'s status."""
    # Names that came from the OS as bytes (argv, paths) and are not UTF-8 reach Python as
    # lone surrogates; write them back as the same bytes instead of failing on output.
    # (stderr already escapes them with backslashes.)
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="surrogateescape")
    sys.exit(main())


if __name__ == "__main__":
    entry()
