"""`dispatch kill`: stop a session and everything it started.

The session is named as for ``logs``: a session id, or a kanban card id (its latest run's
worker) or run id. Scoped sessions: the scope is stopped. Otherwise the worker's process group
gets SIGTERM, then SIGKILL after the grace (``--grace``, default ``registry.kill_grace``), and
nothing may survive. Killing a session that already finished succeeds and changes nothing.
"""

from __future__ import annotations

import argparse

from dispatcher.app.documents import session_json
from dispatcher.app.runtime import runtime_from_context
from dispatcher.cli.context import Context
from dispatcher.cli.logs_cmd import session_id_for
from dispatcher.cli.parser import Parser, Subparsers, add_group
from dispatcher.cli.ps_cmd import describe_end
from dispatcher.cli.wait_cmd import duration_arg

DESCRIPTION = (
    "Stop a session (or a kanban card's or run's worker) and everything it started: a scoped "
    "session's scope is stopped; otherwise the worker's process group gets SIGTERM, then "
    "SIGKILL after the grace (--grace, default registry.kill_grace), and nothing may survive "
    "(exit 1 if something does). Killing a session that already finished succeeds and changes "
    "nothing."
)


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `kill` command."""
    parser = add_group(subparsers, "kill", common, description=DESCRIPTION)
    parser.add_argument(
        "id",
        help="session id or a unique prefix (at least 4 characters), or a kanban card id "
        "(its latest run's worker) or run id",
    )
    parser.add_argument(
        "--grace", metavar="S", help="seconds between SIGTERM and SIGKILL (default: config)"
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Kill and report the final state; exit 1 when something survived."""
    grace = duration_arg(args.grace, "--grace")
    runtime = runtime_from_context(ctx)
    session = runtime.registry.resolve(session_id_for(runtime, args.id, ctx.environ))
    was_running = not session.finished
    snapshot = runtime.registry.kill(session.id, grace=grace, reason="killed by dispatch kill")
    final = snapshot.session
    if ctx.json:
        ctx.emit_json(session_json(final))
    elif was_running:
        ctx.out(f"{final.id} {final.state.value} ({describe_end(final)})")
    else:
        ctx.out(f"{final.id} had already finished: {final.state.value} ({describe_end(final)})")
    return 0
