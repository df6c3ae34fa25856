"""`dispatch ps`: list registry sessions (running ones; ``--all`` adds finished ones)."""

from __future__ import annotations

import argparse
from typing import Any

from dispatcher.app.runtime import runtime_from_context
from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from dispatcher.timefmt import iso, short
from registry.abc import Session


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `ps` command."""
    parser = add_group(
        subparsers,
        "ps",
        common,
        description="List registry sessions: running ones, or all with --all (newest first).",
    )
    parser.add_argument("--all", "-a", action="store_true", help="include finished sessions")
    parser.set_defaults(handler=handle)


def session_json(session: Session) -> dict[str, Any]:
    """The JSON shape of a session (``ps --json`` and the other commands' ``--json``)."""
    return {
        "id": session.id,
        "state": session.state.value,
        "argv": list(session.argv),
        "pid": session.worker_pid,
        "placement": session.placement.value,
        "unit": session.unit,
        "owner": str(session.owner),
        "started_at": iso(session.started_at),
        "finished_at": iso(session.finished_at),
        "exit_code": session.exit_code,
        "signal": session.signal,
        "completion_reason": session.completion_reason,
        "log_path": session.log_path,
    }


def describe_end(session: Session) -> str:
    """``exit 3``, ``SIGKILL``, ``running`` ... for tables and one-line reports."""
    if not session.finished:
        return "-"
    if session.signal:
        return session.signal
    if session.exit_code is not None:
        return f"exit {session.exit_code}"
    return "-"


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Print the sessions as a table or one JSON array."""
    runtime = runtime_from_context(ctx)
    sessions = runtime.registry.list_sessions(include_finished=args.all)
    if ctx.json:
        ctx.emit_json([session_json(s) for s in sessions])
        return 0
    if not sessions:
        ctx.out("no sessions" if args.all else "no running sessions (--all lists finished ones)")
        return 0
    rows = [("ID", "STATE", "PID", "PLACEMENT", "STARTED", "END", "COMMAND")]
    for s in sessions:
        rows.append(
            (
                s.id,
                s.state.value,
                str(s.worker_pid or "-"),
                s.placement.value,
                short(s.started_at),
                describe_end(s),
                " ".join(s.argv),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        ctx.out("  ".join([*cells, row[-1]]))
    return 0
