"""Entry point of the ``dispatch`` command.

Each subcommand group lives in its own module exposing ``register(subparsers, common)``; the
handler a module installs with ``set_defaults(handler=...)`` receives ``(args, ctx)`` and returns
the exit status. Errors derived from :class:`~scope.foundation.errors.DispatchError` become one
line on stderr and their class's exit code; so does an ``ImportError`` (an incomplete
installation: exit 1, :class:`~dispatcher.errors.MissingModule`); anything else is a bug and
shows a traceback.
"""

from __future__ import annotations

import os
import sys

from dispatcher import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs the CLI's start-up
    import argparse
    from collections.abc import Mapping, Sequence

    from dispatcher.cli.context import Context
    from dispatcher.cli.parser import Parser
    from scope.foundation.clock import Clock
    from scope.foundation.errors import DispatchError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_RESTART = 75
EXIT_CLOSED_STDOUT = 141


def build_parser(argv: Sequence[str] | None = None) -> Parser:
    """The argument parser for ``argv``.

    Only the group ``argv`` names is imported and registered in full; the others are one-line
    placeholders, so start-up stays cheap and ``--help`` still lists every group. Without
    ``argv`` every group is registered (for documentation and tests)."""
    import importlib

    from dispatcher.cli.groups import GROUPS, chosen_group
    from dispatcher.cli.parser import Parser, Version, global_options

    common = global_options()
    parser = Parser(
        prog="dispatch",
        description="Kanban/cron worker dispatcher with restart-safe systemd scoping.",
        parents=[common],
        epilog="Exit codes: 0 ok, 1 failed/unhealthy, 2 usage or config error, "
        "75 serve asks for a restart. Docs: docs/ in the source tree.",
    )
    parser.add_argument("--version", action=Version, help="print the version and exit")
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


def parse(arguments: list[str]) -> argparse.Namespace:
    """Parse a command line; every usage error names the problem and points at the help of
    the innermost command it concerns (``see 'dispatch kanban add --help'``)."""
    from dispatcher.cli.groups import chosen_group, unknown_global_option
    from dispatcher.cli.parser import check_text_arguments, safe_message
    from scope.foundation.errors import UsageError

    parser = build_parser(arguments)
    if chosen_group(arguments) is None:
        # Without a command argparse would only say "required: COMMAND", hiding the typo.
        unknown = unknown_global_option(arguments)
        if unknown is not None:
            raise UsageError(
                f"unrecognized argument: {safe_message(unknown, [unknown])} (see 'dispatch --help')"
            )
    args, extras = parser.parse_known_args(arguments)
    if extras:
        raise UsageError(
            f"unrecognized arguments: {safe_message(' '.join(extras), extras)} "
            f"(see '{command_path(args, arguments)} --help')"
        )
    check_text_arguments(parser, args)
    return args


def command_path(args: argparse.Namespace, arguments: list[str]) -> str:
    """``dispatch kanban add`` for a parsed ``dispatch kanban add ...``."""
    from dispatcher.cli.groups import chosen_group

    parts = ["dispatch"]
    group = chosen_group(arguments)  # not args.command: `run` keeps its argv under that name
    if group:
        parts.append(group)
        sub = getattr(args, f"{group}_command", None)
        if isinstance(sub, str):
            parts.append(sub)
    return " ".join(parts)


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    clock: Clock | None = None,
) -> int:
    """Run the CLI; returns the exit status (the console script exits with it). ``clock``
    fixes "now" for the times the views show (tests)."""
    environ = os.environ if environ is None else environ
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments == ["--version"]:
        # The one answer that needs no parser at all (every oneshot tick and completion
        # script asks it): printed before argparse is even imported.
        sys.stdout.write(f"dispatch {__version__}\n")
        return 0
    try:
        relayed = _relayed(arguments, environ)
        if relayed is not None:
            return relayed
        args = _recognised(arguments, environ)
    except ImportError as err:
        return _missing_module(err)
    if args is not None:
        return _run(args, environ, clock, fast=True)
    from scope.foundation.errors import DispatchError

    try:
        # Parsing needs nothing but argparse: --version and usage errors end here, before
        # logging, the database driver or the command's modules are imported.
        args = parse(arguments)
    except DispatchError as err:
        _print_error(err)
        return err.exit_code
    except ImportError as err:
        return _missing_module(err)
    return _run(args, environ, clock)


def _relayed(arguments: list[str], environ: Mapping[str, str]) -> int | None:
    """The status of a short write command the gateway answered (:mod:`dispatcher.app.relay`),
    or None: the command runs here."""
    if "kanban" not in arguments:
        return None
    from dispatcher.app.relay import relay

    return relay(arguments, environ)


def _recognised(arguments: list[str], environ: Mapping[str, str]) -> argparse.Namespace | None:
    """The command line parsed by the fast path (:mod:`dispatcher.cli.fastpath`: ``kanban
    add`` and the worker reports, without argparse), or None: argparse parses it."""
    if "kanban" not in arguments:
        return None  # no fast-path command: not even its grammar is loaded
    from dispatcher.cli.fastpath import recognise

    # A SimpleNamespace with argparse's attributes (importing argparse for its Namespace would
    # cost the fast path): handlers only read attributes.
    return recognise(arguments, environ)  # type: ignore[return-value]


def _run(
    args: argparse.Namespace, environ: Mapping[str, str], clock: Clock | None, *, fast: bool = False
) -> int:
    """Run the parsed command: one line on stderr for our errors, see :func:`main`. ``fast``:
    the fast path parsed it, whose handlers show warnings only once they leave it (nothing
    before logs, and importing logging would be a tenth of their start-up)."""
    import sqlite3

    from dispatcher.cli.context import Context
    from scope.foundation.errors import DispatchError

    ctx: Context | None = None
    try:
        ctx = Context(args, environ, clock=clock)
        if not fast:
            ctx.show_warnings()
        if ctx.read_only:
            # A broken config is named once, up front, whether or not the view needs it.
            ctx.config  # noqa: B018
        status = args.handler(args, ctx)
        # Flushed here, not at interpreter exit, so a reader that went away (| head) is
        # handled below like any other closed stdout.
        ctx.stdout.flush()
        return int(status or 0)
    except DispatchError as err:
        _print_error(err)
        return err.exit_code
    except ImportError as err:
        return _missing_module(err)
    except sqlite3.DatabaseError as err:
        # Store queries raise sqlite3 errors for a damaged or foreign database: one line, no
        # traceback (the state module translates what it can foresee; this is the backstop).
        print(f"dispatch: error: state database: {err}; check --state-dir", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("dispatch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (| head): no traceback and no message, and the same status for
        # every command and output format: 128 + SIGPIPE, what a shell reports for a program
        # that a closed pipe ended (cat, and most tools that do not catch SIGPIPE).
        _silence_stdout()
        return EXIT_CLOSED_STDOUT
    finally:
        if ctx is not None:
            try:
                ctx.close()
            finally:
                ctx.hide_warnings()


def _missing_module(err: ImportError) -> int:
    """An incomplete installation is one line and exit 1 for every command, not a traceback
    (a dependency missing from a plain ``pip install``: issue 19)."""
    from dispatcher.errors import MissingModule

    _print_error(MissingModule.from_import_error(err))
    return EXIT_FAILED


def _print_error(err: DispatchError) -> None:
    """The one stderr line of an error (:func:`error_text`)."""
    print(error_text(err), file=sys.stderr)


def error_text(err: DispatchError) -> str:
    """The one line an error is shown as; escaped and bounded whatever the message holds
    (its parts quote user text already; this is the backstop)."""
    from scope.foundation.text import one_line

    return f"dispatch: error: {one_line(err.message)}"


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except OSError:
        pass


def entry() -> None:
    """Console-script entry: exit with :func:`main`'s status (or answer a shell's completion
    request and exit; that costs nothing when no shell asks)."""
    if "_ARGCOMPLETE" in os.environ:
        from dispatcher.cli.completion import entry_hook

        entry_hook()
    # Names that came from the OS as bytes (argv, paths) and are not UTF-8 reach Python as
    # lone surrogates; write them back as the same bytes instead of failing on output.
    # (stderr already escapes them with backslashes.)
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="surrogateescape")
    sys.exit(main())


if __name__ == "__main__":
    entry()
