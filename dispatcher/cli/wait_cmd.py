"""`dispatch wait`: wait for a session to finish and exit with its result.

Exit status: the worker's exit code, 128+N when it died of signal N, 127 for ``failed_start``,
1 for ``lost``, 124 when ``--timeout`` elapsed first and 130 on Ctrl-C (in both cases the worker
keeps running).
"""

from __future__ import annotations

import argparse
import signal

from dispatcher.app.documents import session_json
from dispatcher.app.runtime import runtime_from_context
from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from dispatcher.cli.ps_cmd import describe_end
from registry.abc import Session, SessionState, WaitOutcome
from scope.foundation.errors import UsageError
from scope.foundation.schema import Invalid, parse_duration

EXIT_TIMEOUT = 124
EXIT_FAILED_START = 127
EXIT_LOST = 1


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `wait` command."""
    parser = add_group(
        subparsers,
        "wait",
        common,
        description="Wait for a session to finish and exit with its result: its exit code, "
        "128+N for signal N, 127 failed_start, 124 when --timeout elapsed (the worker keeps "
        "running), 130 on Ctrl-C.",
    )
    parser.add_argument("id", help="session id or a unique prefix (at least 4 characters)")
    parser.add_argument(
        "--timeout", metavar="S", help="give up after this long (seconds or 30s, 5m ...)"
    )
    parser.set_defaults(handler=handle)


def duration_arg(value: str | None, flag: str = "--timeout") -> float | None:
    """A duration flag's value in seconds (None when absent); bad values are usage errors."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except Invalid as err:
        raise UsageError(f"{flag}: {err.problem}") from None


def still_running(session_id: str, timeout: float | None) -> str:
    """The warning when ``--timeout`` elapsed first: ``s1 still running after 1 s; ...``."""
    return f"{session_id} still running after {timeout or 0:g} s; it keeps running"


def exit_status(session: Session) -> int:
    """The shell exit status that passes a finished session's result through."""
    if session.state is SessionState.FAILED_START:
        return EXIT_FAILED_START
    if session.signal:
        try:
            return 128 + int(signal.Signals[session.signal])
        except KeyError:
            return 128
    if session.exit_code is not None:
        return session.exit_code
    return EXIT_LOST


def report(ctx: Context, session: Session) -> None:
    """One stderr line for sessions that did not simply exit 0."""
    if session.state is SessionState.EXITED and session.exit_code == 0:
        return
    ctx.warn(
        f"{session.id} {session.state.value} ({describe_end(session)}): "
        f"{session.completion_reason or ''}".rstrip(": ")
    )


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Wait, then exit with the session's result."""
    timeout = duration_arg(args.timeout)
    runtime = runtime_from_context(ctx)
    session = runtime.registry.resolve(args.id)
    result = runtime.registry.wait(session.id, timeout=timeout)
    final = result.snapshot.session
    if ctx.json:
        ctx.emit_json({**session_json(final), "outcome": result.outcome.value})
    if result.outcome is WaitOutcome.TIMEOUT:
        ctx.warn(still_running(final.id, timeout))
        return EXIT_TIMEOUT
    if not ctx.json:
        report(ctx, final)
    return exit_status(final)
