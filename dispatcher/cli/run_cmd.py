"""`dispatch run`: start a command as a registry session.

``dispatch run [--pty] [--cwd DIR] [--env NAME=VALUE]... [--wait [--timeout S]] [--follow]
[--shell] [--notify] [--heartbeat S] [--watch PATTERN] [--watch-regex REGEX] -- CMD ARGS...``

Prints the session id as the only line on stdout (``--json``: the session as JSON), then exits.
``--wait`` waits for the worker and passes its result through as the exit status (its exit
code, 128+N for signal N, 127 ``failed_start``, 124 when ``--timeout`` elapsed first, 130 on
Ctrl-C; in the last two cases the worker keeps running). ``--follow`` streams the output to
stdout instead of printing the id (the id goes to stderr) and exits like ``--wait``. The argv is
never given to a shell unless ``--shell`` is set, in which case CMD is one string for /bin/sh -c.

``--notify`` publishes a completion event when the session ends, ``--heartbeat S`` a heartbeat
event every S seconds (at least 60) with the output since the previous one, ``--watch``
a watch event for output lines containing PATTERN (``--watch-regex``: matching REGEX). The
events are routed to the caller (owner ``cli:<user>:<pid>``) and read with ``dispatch events``.
Heartbeat and watch events come from a process following the session: this command with
``--wait``/``--follow``, or the gateway.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re

from dispatcher.app.documents import session_json
from dispatcher.app.runtime import runtime_from_context
from dispatcher.cli.context import Context
from dispatcher.cli.logs_cmd import stream
from dispatcher.cli.parser import Parser, Subparsers, add_group, path_arg
from dispatcher.cli.wait_cmd import (
    EXIT_TIMEOUT,
    duration_arg,
    exit_status,
    report,
    still_running,
)
from registry.abc import HEARTBEAT_FLOOR, Owner, SpawnRequest, WaitOutcome, WatchPattern
from registry.environment import MARKER_ENV
from scope.abc import CallerKind
from scope.foundation.errors import UsageError
from scope.foundation.text import quote

DESCRIPTION = (
    "Start CMD ARGS (after --) as a registry session and print its id as the only stdout line. "
    "--wait waits and exits with the worker's result: its exit code, 128+N for signal N, 127 "
    "failed_start, 124 when --timeout elapsed first, 130 on Ctrl-C (the worker keeps running "
    "in the last two cases). --follow streams the output instead of printing the id (the id "
    "goes to stderr) and exits like --wait. Nothing goes through a shell unless --shell is "
    "given; then CMD is one string run by /bin/sh -c."
)


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `run` command."""
    parser = add_group(
        subparsers,
        "run",
        common,
        description=DESCRIPTION,
    )
    parser.add_argument("--pty", action="store_true", help="run on a pseudo-terminal")
    parser.add_argument(
        "--cwd", type=path_arg, metavar="DIR", help="working directory (default: the current)"
    )
    parser.add_argument(
        "--wait", action="store_true", help="wait for the worker; exit with its result"
    )
    parser.add_argument(
        "--timeout", metavar="S", help="with --wait/--follow: stop waiting after S (exit 124)"
    )
    parser.add_argument(
        "--follow", action="store_true", help="stream the output; exit with the result"
    )
    parser.add_argument("--shell", action="store_true", help="CMD is one string run by /bin/sh -c")
    parser.add_argument(
        "--env",
        "-e",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set NAME to VALUE in the worker's environment (repeatable; the value may be "
        "empty or contain '=')",
    )
    parser.add_argument(
        "--notify", action="store_true", help="publish a completion event when it ends"
    )
    parser.add_argument(
        "--heartbeat",
        metavar="S",
        help=f"publish a heartbeat event every S (at least {int(HEARTBEAT_FLOOR)}s) with the "
        "output since the previous one",
    )
    parser.add_argument(
        "--heartbeat-liveness",
        action="store_true",
        help="with --heartbeat: also when nothing new was printed",
    )
    parser.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="PATTERN",
        help="publish a watch event for output lines containing PATTERN (repeatable)",
    )
    parser.add_argument(
        "--watch-regex",
        action="append",
        default=[],
        metavar="REGEX",
        help="publish a watch event for output lines matching REGEX (repeatable)",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ARGS",
        help="the command and its arguments, after -- (one string with --shell)",
    )
    parser.set_defaults(handler=handle)


def _command(args: argparse.Namespace) -> list[str] | str:
    words = list(args.command)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise UsageError("no command given", remedy="usage: dispatch run [options] -- CMD ARGS...")
    if args.shell:
        if len(words) != 1:
            raise UsageError(
                f"--shell takes the command as one string, got {len(words)} words",
                remedy="quote it: dispatch run --shell -- 'cmd | other'",
            )
        return words[0]
    return words


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_assignments(values: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` flags as a mapping; a bad name is a usage error."""
    found: dict[str, str] = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            # The name only: what follows '=' may be a secret.
            raise UsageError(
                f"--env {quote(name)}: expected NAME=VALUE with NAME made of letters, digits "
                "and '_', not starting with a digit"
            )
        if "\0" in text:
            raise UsageError(f"--env {name}: the value holds a NUL byte, which no environment can")
        if name == MARKER_ENV:
            raise UsageError(f"--env {name}: set by dispatch itself (it marks the session)")
        found[name] = text
    return found


def _owner() -> Owner:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return Owner(kind="cli", id=f"{user}:{os.getpid()}")


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Spawn, then print the id, wait or follow."""
    command = _command(args)
    extra_env = env_assignments(args.env)
    timeout = duration_arg(args.timeout)
    if timeout is not None and not (args.wait or args.follow):
        raise UsageError("--timeout needs --wait or --follow")
    cwd = os.path.abspath(args.cwd) if args.cwd else os.getcwd()
    heartbeat = duration_arg(args.heartbeat, "--heartbeat")
    if heartbeat is not None and heartbeat <= 0:
        raise UsageError(f"--heartbeat {args.heartbeat!r}: give a positive duration")
    if args.heartbeat_liveness and heartbeat is None:
        raise UsageError("--heartbeat-liveness needs --heartbeat")
    watch = [WatchPattern(pattern=p) for p in args.watch] + [
        WatchPattern(pattern=p, regex=True) for p in args.watch_regex
    ]
    if heartbeat is not None and heartbeat < HEARTBEAT_FLOOR:
        ctx.warn(f"--heartbeat {args.heartbeat}: raised to the floor of {int(HEARTBEAT_FLOOR)}s")
    if (heartbeat is not None or watch) and not (args.wait or args.follow):
        ctx.warn(
            "heartbeat and watch events come from a process that follows the session: "
            "add --wait or --follow, or let the gateway (dispatch serve) adopt it"
        )
    runtime = runtime_from_context(
        ctx, caller_kind=CallerKind.CLI, follow=bool(args.wait or args.follow)
    )
    registry = runtime.registry
    session = registry.spawn(
        SpawnRequest(
            argv=command,
            cwd=cwd,
            env={**ctx.environ, **extra_env},
            owner=_owner(),
            caller=CallerKind.CLI,
            pty=args.pty,
            shell=args.shell,
            notify=args.notify,
            heartbeat=heartbeat,
            heartbeat_liveness=args.heartbeat_liveness,
            watch=watch,
        )
    )
    # session.warning (a degraded placement) was already logged once by the scope layer.
    if args.follow:
        ctx.warn(f"session {session.id}")
    elif not ctx.json:
        ctx.out(session.id)
        ctx.stdout.flush()
    if not (args.wait or args.follow):
        if ctx.json:
            ctx.emit_json(session_json(session))
        return 0
    if args.follow:
        followed = stream(ctx, registry.follow_log(session.id, 0, timeout=timeout))
        if followed is None:
            ctx.warn(still_running(session.id, timeout))
            return EXIT_TIMEOUT
        final = followed
    else:
        result = registry.wait(session.id, timeout=timeout)
        final = result.snapshot.session
        if result.outcome is WaitOutcome.TIMEOUT:
            if ctx.json:
                ctx.emit_json({**session_json(final), "outcome": result.outcome.value})
            ctx.warn(still_running(session.id, timeout))
            return EXIT_TIMEOUT
    if ctx.json:
        ctx.emit_json(session_json(final))
    else:
        report(ctx, final)
    return exit_status(final)
