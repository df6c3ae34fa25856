"""`dispatch notify`: the notification outbox.

``dispatch notify list [--dead]`` shows deliveries (one row per message and channel: id,
channel, event, state, attempts, last error); ``dispatch notify retry ID`` (or a unique
prefix) makes a message's undelivered rows due now with a fresh deadline (serve's sender
delivers them);
``dispatch notify test CHANNEL`` sends a test message at once and prints what the receiver
answered (exit 1 when it refused).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group, add_subgroups
from scope.foundation.errors import UsageError


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `notify` command and its subcommands."""
    parser = add_group(subparsers, "notify", common)
    subs = add_subgroups(parser, "notify_command")
    shown = subs.add_parser(
        "list", parents=[common], help="List deliveries, newest first (state, attempts, error)."
    )
    shown.add_argument("--dead", action="store_true", help="only the dead ones")
    shown.set_defaults(handler=handle_list)
    again = subs.add_parser(
        "retry", parents=[common], help="Make a message's undelivered rows due now (new deadline)."
    )
    again.add_argument("id", help="the message id or a unique prefix (from 'dispatch notify list')")
    again.set_defaults(handler=handle_retry)
    probe = subs.add_parser(
        "test", parents=[common], help="Send a test message to CHANNEL and print the answer."
    )
    probe.add_argument("channel", help="a channel under notify.channels")
    probe.set_defaults(handler=handle_test)


def handle_list(args: argparse.Namespace, ctx: Context) -> int:
    """List the outbox."""
    from dispatcher.app.clusterstate import open_cluster_state

    with open_cluster_state(ctx.settings, ctx.state_dir, ctx.environ) as state:
        rows = state.notify_store().list(state="dead" if args.dead else None)
    if ctx.json:
        ctx.emit_json([row.to_dict() for row in rows])
        return 0
    if not rows:
        ctx.out("no dead notifications" if args.dead else "no notifications")
        return 0
    times = ctx.times()
    ctx.out(f"{'ID':<32} {'CHANNEL':<14} {'EVENT':<24} {'STATE':<9} {'TRIES':>5}  CREATED")
    for row in rows:
        line = (
            f"{row.message_id:<32} {row.channel:<14} {row.event:<24} {row.state:<9} "
            f"{row.attempts:>5}  {times.both(row.created_at)}"
        )
        ctx.out(
            line + (f"  {row.last_error}" if row.last_error and row.state != "delivered" else "")
        )
    return 0


def handle_retry(args: argparse.Namespace, ctx: Context) -> int:
    """Make a message due again."""
    from dispatcher.app.clusterstate import open_cluster_state

    with open_cluster_state(ctx.settings, ctx.state_dir, ctx.environ) as state:
        found, touched = state.notify_store().retry_named(args.id, now=time.time())
    if ctx.json:
        ctx.emit_json({"id": found, "rows": touched})
    else:
        ctx.out(f"notification {found}: {touched} deliveries due now")
    return 0


def handle_test(args: argparse.Namespace, ctx: Context) -> int:
    """Send a test message now, outside the outbox."""
    from dispatcher.notify.sender import deliver, load_secret

    channel = ctx.settings.notify.channels.get(args.channel)
    if channel is None:
        known = ", ".join(sorted(ctx.settings.notify.channels)) or "none"
        raise UsageError(
            f"unknown channel {args.channel!r} (defined: {known})",
            remedy="define it under notify.channels in config.yaml",
        )
    secret = None
    if channel.webhook is not None and channel.webhook.secret_file:
        key = f"notify.channels.{args.channel}.webhook.secret_file"
        secret = load_secret(channel.webhook.secret_file, key=key, source=ctx.config_path)
    message = {"id": uuid.uuid4().hex, "event": "test", "at": time.time(), "channel": args.channel}
    answer = deliver(channel, json.dumps(message, sort_keys=True), secret)
    if ctx.json:
        ctx.emit_json({"id": message["id"], "ok": answer.ok, "answer": answer.detail})
    else:
        ctx.out(f"{'delivered' if answer.ok else 'refused'}: {answer.detail}")
    return 0 if answer.ok else 1
