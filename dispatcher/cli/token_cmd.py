"""`dispatch web token`: the HTTP API's bearer tokens.

``create --name NAME --scope read|operate [--expires 90d]`` prints the new token once (only
its SHA-256 digest is stored); ``list`` shows every token with its scope, state and last
use, never a token's text; ``revoke ID|NAME`` ends one at once. Tokens live beside the board:
in the state database, or in the cluster database in cluster mode, so every host's ``dispatch
web`` accepts them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_subgroups
from dispatcher.timefmt import iso
from scope.foundation.errors import Invalid, UsageError
from scope.foundation.values import parse_duration

if TYPE_CHECKING:
    from dispatcher.tokens.store import TokenStore

SCOPE_HELP = "read: every GET; operate: also add, edit, move, retry, kill, run cron jobs"


def register(web_commands: Subparsers, common: Parser) -> None:
    """Add ``token create|list|revoke`` under ``dispatch web``."""
    token = web_commands.add_parser(
        "token",
        parents=[common],
        help="Make, list and revoke the HTTP API's bearer tokens.",
        description=__doc__.split("\n\n")[1].replace("``", "'"),
    )
    subs = add_subgroups(token, "token_command")
    create = subs.add_parser(
        "create", parents=[common], help="Make a token; prints it once (stored hashed)."
    )
    create.add_argument("--name", required=True, metavar="NAME", help="who uses it (e.g. ci)")
    create.add_argument("--scope", required=True, choices=["read", "operate"], help=SCOPE_HELP)
    create.add_argument(
        "--expires", metavar="DURATION", help="valid for this long (90d, 12h); default: no end"
    )
    create.set_defaults(handler=handle_create)
    listing = subs.add_parser(
        "list", parents=[common], help="Tokens with scope, state and last use (never the token)."
    )
    listing.set_defaults(handler=handle_list)
    revoke = subs.add_parser("revoke", parents=[common], help="Revoke a token at once.")
    revoke.add_argument("token", metavar="ID|NAME", help="a token id (or prefix) or its name")
    revoke.set_defaults(handler=handle_revoke)


def _store(ctx: Context) -> TokenStore:
    from dispatcher.app.clusterstate import open_cluster_state

    state = open_cluster_state(ctx.settings, ctx.state_dir, ctx.environ)
    ctx.on_close(state)
    return state.token_store()


def handle_create(args: argparse.Namespace, ctx: Context) -> int:
    """Make a token and print it (the only time it is shown)."""
    now = ctx.clock.time()
    expires_at = None
    if args.expires is not None:
        try:
            expires_at = now + parse_duration(args.expires)
        except Invalid as err:
            raise UsageError(f"--expires: {err.problem}", remedy="e.g. --expires 90d") from None
    token, text = _store(ctx).create(args.name, args.scope, now=now, expires_at=expires_at)
    if ctx.json:
        ctx.emit_json({**token.to_dict(now), "token": text})
        return 0
    ctx.out(text)
    until = f", expires {iso(expires_at)}" if expires_at is not None else ""
    ctx.warn(
        f"token {token.id} {token.name!r} ({token.scope}{until}): shown only now, keep it; "
        "send it as 'Authorization: Bearer TOKEN'"
    )
    return 0


def handle_list(args: argparse.Namespace, ctx: Context) -> int:
    """Every token, oldest first."""
    now = ctx.clock.time()
    tokens = _store(ctx).list()
    if ctx.json:
        ctx.emit_json([t.to_dict(now) for t in tokens])
        return 0
    if not tokens:
        ctx.out("no API tokens ('dispatch web token create --name NAME --scope read' makes one)")
        return 0
    times = ctx.times()
    ctx.out(f"{'ID':<12}  {'NAME':<16}  {'SCOPE':<7}  {'STATE':<7}  {'CREATED':<10}  LAST USE")
    for t in tokens:
        used = times.ago(t.last_used_at) if t.last_used_at else "never"
        ctx.out(
            f"{t.id:<12}  {t.name[:16]:<16}  {t.scope:<7}  {t.state(now):<7}  "
            f"{times.ago(t.created_at):<10}  {used}"
        )
    return 0


def handle_revoke(args: argparse.Namespace, ctx: Context) -> int:
    """Revoke one token (revoking twice is harmless)."""
    now = ctx.clock.time()
    token, changed = _store(ctx).revoke(args.token, now=now)
    if ctx.json:
        ctx.emit_json({**token.to_dict(now), "changed": changed})
    else:
        ctx.out(f"{token.id} {token.name} revoked" + ("" if changed else " (already)"))
    return 0
