"""`dispatch ps`: list registry sessions (running ones; ``--all`` adds finished ones)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from dispatcher.app.documents import select_sessions, session_json
from dispatcher.app.runtime import runtime_from_context
from dispatcher.cli.context import Context
from dispatcher.cli.options import positive_int, since_arg, watch_options, watched
from dispatcher.cli.parser import Parser, Subparsers, add_group
from registry.abc import Session, SessionState


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `ps` command."""
    parser = add_group(
        subparsers,
        "ps",
        common,
        description="List registry sessions: running ones, or all with --all (newest first). "
        "--state, --owner and --since filter, --limit keeps the newest N.",
    )
    parser.add_argument("--all", "-a", action="store_true", help="include finished sessions")
    parser.add_argument(
        "--state",
        action="append",
        choices=[s.value for s in SessionState],
        metavar="STATE",
        help="only sessions in STATE (repeatable; a finished state implies --all): "
        + ", ".join(s.value for s in SessionState),
    )
    parser.add_argument(
        "--owner",
        metavar="OWNER",
        help="only sessions of this owner: exact (kanban:r_1a2b) or a prefix ending before "
        "a colon (cli, cli:alice, cron)",
    )
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only sessions started since WHEN: a duration back (30m, 2h, 1d) or an ISO-8601 "
        "time; implies --all",
    )
    parser.add_argument("--limit", type=positive_int, metavar="N", help="at most N, newest first")
    watch_options(parser)
    parser.set_defaults(handler=handle)


def describe_end(session: Session) -> str:
    """``exit 3``, ``SIGKILL``, ``running`` ... for tables and one-line reports."""
    if not session.finished:
        return "-"
    if session.signal:
        return session.signal
    if session.exit_code is not None:
        return f"exit {session.exit_code}"
    return "-"


def select(sessions: Sequence[Session], args: argparse.Namespace, now: float) -> list[Session]:
    """The sessions ``--state``, ``--owner``, ``--since`` and ``--limit`` keep."""
    return select_sessions(
        sessions,
        states=args.state or (),
        owner=args.owner,
        since=since_arg(args.since, now) if args.since else None,
        limit=args.limit,
    )


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Print the sessions as a table or one JSON array (``--watch``: again and again)."""
    return watched(args, ctx, lambda: _once(args, ctx))


def _once(args: argparse.Namespace, ctx: Context) -> int:
    runtime = runtime_from_context(ctx)
    finished = bool(args.all or args.since or set(args.state or ()) - {"running"})
    times = ctx.times()
    sessions = select(runtime.registry.list_sessions(include_finished=finished), args, times.now)
    if ctx.json:
        ctx.emit_json([session_json(s) for s in sessions])
        return 0
    if not sessions:
        filtered = args.state or args.owner or args.since
        ctx.out(
            "no matching sessions"
            if filtered
            else "no sessions"
            if args.all
            else "no running sessions (--all lists finished ones)"
        )
        return 0
    rows = [("ID", "STATE", "PID", "PLACEMENT", "STARTED", "END", "COMMAND")]
    for s in sessions:
        rows.append(
            (
                s.id,
                s.state.value,
                str(s.worker_pid or "-"),
                s.placement.value,
                times.both(s.started_at),
                describe_end(s),
                " ".join(s.argv),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        ctx.out("  ".join([*cells, row[-1]]))
    return 0
