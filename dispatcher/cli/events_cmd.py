"""`dispatch events`: list, follow and acknowledge registry events.

``dispatch events [--follow] [--ack ID...] [--owner OWNER] [--all] [--session ID] [--json]``

Lists the unacknowledged events (``--all``: acknowledged ones too), oldest first; ``--json``
prints one array of event objects (``id``, ``seq``, ``type``, ``session_id``, ``owner``,
``exit_code``, ``signal``, ``completion_reason``, ``output``, ``output_cut``, ``created_at``,
plus ``state``, ``log_path``, ``note``, ``data``, ``acked_at``). ``--follow`` keeps printing new
events until Ctrl-C (with ``--json``: one object per line). ``--ack ID...`` acknowledges events
by id; acknowledging twice is harmless, an unknown id is exit 2. Listing never acknowledges:
a consumer acknowledges what it has processed, so a crash in between shows the event again.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from dispatcher.app.runtime import runtime_from_context
from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from dispatcher.timefmt import TimeView, iso
from registry.abc import Event, EventType, Registry
from scope.foundation.errors import NotFoundError, UsageError

DESCRIPTION = (
    "List the unacknowledged registry events (completions, heartbeats, watch matches, "
    "handoffs, orphaned sessions), oldest first; --all includes acknowledged ones. --follow "
    "keeps printing new events until Ctrl-C. --ack ID... acknowledges events by id (a repeated "
    "ack is harmless). --owner limits to one owner (exact, or a prefix such as 'cli' or "
    "'cli:alice')."
)
FOLLOW_INTERVAL = 0.5
"""Seconds between looks for new events with --follow (another process writes them)."""


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `events` command."""
    parser = add_group(subparsers, "events", common, description=DESCRIPTION)
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    parser.add_argument("--ack", nargs="+", metavar="ID", help="acknowledge these event ids")
    parser.add_argument("--owner", metavar="OWNER", help="only events routed to this owner")
    parser.add_argument("--session", metavar="ID", help="only events of this session")
    parser.add_argument("--all", "-a", action="store_true", help="include acknowledged events")
    parser.set_defaults(handler=handle)


def event_json(event: Event) -> dict[str, Any]:
    """The JSON shape of an event."""
    return {
        "id": event.id,
        "seq": event.seq,
        "type": event.type.value,
        "session_id": event.session_id,
        "owner": str(event.owner),
        "state": event.state.value if event.state else None,
        "exit_code": event.exit_code,
        "signal": event.signal,
        "completion_reason": event.completion_reason,
        "output": event.output,
        "output_cut": event.output_cut,
        "log_path": event.log_path,
        "note": event.note,
        "data": dict(event.data),
        "created_at": iso(event.created_at),
        "acked_at": iso(event.acked_at),
    }


def describe(event: Event, times: TimeView | None = None) -> str:
    """One human line for an event."""
    times = times or TimeView.local()
    if event.completion_reason:
        summary = event.completion_reason
    elif event.type is EventType.WATCH:
        first = event.output.splitlines()[0] if event.output else ""
        summary = f"{event.data.get('matches', 1)} line(s): {first}"
    elif event.type is EventType.HEARTBEAT:
        summary = f"{event.data.get('bytes', 0)} new bytes"
    elif event.note:
        summary = event.note
    else:
        summary = str(event.data.get("reason") or "")
    if event.note and event.type is EventType.COMPLETION:
        summary = f"{summary} [handoff: {event.note}]"
    return (
        f"{event.id}  {times.both(event.created_at)}  {event.session_id}#{event.seq}  "
        f"{event.type.value:<14} {event.owner}  {summary}"
    ).rstrip()


def _acknowledge(ctx: Context, registry: Registry, ids: list[str]) -> int:
    result = registry.ack(ids)
    if ctx.json:
        ctx.emit_json(
            {
                "acked": list(result.acked),
                "already": list(result.already),
                "unknown": list(result.unknown),
            }
        )
    else:
        for event_id in result.acked:
            ctx.out(f"acknowledged {event_id}")
        for event_id in result.already:
            ctx.out(f"{event_id} was acknowledged already")
    if result.unknown:
        raise NotFoundError(
            "event",
            ", ".join(result.unknown),
            remedy="see 'dispatch events --all' for ids (acknowledged events are trimmed "
            "after a while)",
        )
    return 0


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """List, follow or acknowledge."""
    if args.ack and args.follow:
        raise UsageError("--ack and --follow do not go together")
    runtime = runtime_from_context(ctx)
    registry = runtime.registry
    if args.ack:
        return _acknowledge(ctx, registry, list(args.ack))
    session_id = registry.resolve(args.session).id if args.session else None
    # Sessions whose end is recorded but that nobody followed publish their completion now.
    registry.pending_completions(args.owner)
    found = registry.events(owner=args.owner, include_acked=args.all, session_id=session_id)
    if not args.follow:
        if ctx.json:
            ctx.emit_json([event_json(e) for e in found])
        elif not found:
            ctx.out("no events" if args.all else "no unacknowledged events (--all lists all)")
        for event in found if not ctx.json else ():
            ctx.out(describe(event, ctx.times()))
        return 0
    last = found[-1].position if found else _last_position(registry)
    for event in found:
        _print_one(ctx, event)
    while True:
        # Another process stores the events: look again after a short, bounded pause.
        time.sleep(FOLLOW_INTERVAL)
        registry.pending_completions(args.owner)
        for event in registry.events(
            owner=args.owner, include_acked=True, session_id=session_id, after=last
        ):
            last = event.position
            _print_one(ctx, event)


def _last_position(registry: Registry) -> int:
    everything = registry.events(include_acked=True)
    return everything[-1].position if everything else 0


def _print_one(ctx: Context, event: Event) -> None:
    if ctx.json:
        ctx.stdout.write(json.dumps(event_json(event)) + "\n")
    else:
        ctx.out(describe(event, ctx.times()))
    ctx.stdout.flush()
