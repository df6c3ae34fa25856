"""`dispatch web`: the board, runs, logs, cron, sessions and hosts in a browser, and /metrics.

A process of its own (``dispatch serve`` keeps dispatching whatever happens to it). It prints
the address and, once, a sign-in link carrying the installation secret; under systemd, where
stdout goes to the journal, the link is left out (``dispatch web --url`` prints it).
"""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group

DESCRIPTION = (
    "Serve a live dashboard of this state dir: the board (a column per status), cards with "
    "their runs, events and the worker's output, cron jobs with their next fires and history, "
    "registry sessions with their logs, the status and the doctor's remedies, the cluster's "
    "hosts, and Prometheus metrics at /metrics. Actions (add, edit, unblock, move, archive, "
    "kill a run, pause the board, pause/resume/run a cron job) need the installation's secret "
    "(in STATE_DIR/web-secret): open the sign-in link printed at start or by --url."
)
EPILOG = (
    "Only loopback addresses are served unless --allow-remote is given; then every page needs "
    "the secret (a browser signs in once with the link; scripts and Prometheus send "
    "'Authorization: Bearer SECRET'). Exit 0 after SIGINT/SIGTERM, 1 when the port is in use "
    "or the state cannot be opened, 2 for a bad --listen."
)


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `web` command."""
    from dispatcher.web.server import DEFAULT_LISTEN

    parser = add_group(subparsers, "web", common, description=DESCRIPTION)
    parser.epilog = EPILOG
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on (default {DEFAULT_LISTEN}; port 0 picks a free port)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --listen; every page then needs the secret",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also accept this Host header (a DNS name or reverse proxy in front; repeatable)",
    )
    parser.add_argument(
        "--require-secret",
        action="store_true",
        help="every page needs the secret even on loopback (a host shared with other users)",
    )
    parser.add_argument(
        "--url",
        action="store_true",
        help="print the sign-in link (it carries the secret) and exit",
    )
    parser.add_argument(
        "--api-only",
        action="store_true",
        help="serve only the HTTP API under /api/v1/ (no pages, no /metrics)",
    )
    parser.set_defaults(handler=handle)
    from dispatcher.cli import token_cmd

    commands = parser.add_subparsers(dest="web_command", metavar="COMMAND", parser_class=Parser)
    token_cmd.register(commands, common)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Open the state, bind, print the address, serve until stopped."""
    from dispatcher.web.app import create_app, create_site
    from dispatcher.web.guard import Access, cookie_name
    from dispatcher.web.keys import Keys, load_secret
    from dispatcher.web.server import allowed_hosts, bind, check_remote, parse_listen, serve
    from dispatcher.web.source import Source

    listen = parse_listen(args.listen)
    check_remote(listen, args.allow_remote)
    # The state is opened (and so checked: ours, private, readable) before anything is
    # written into the state dir, the secret included.
    source = Source(ctx.settings, ctx.state_dir, ctx.environ, config_path=ctx.config_path)
    ctx.on_close(source)
    secret = load_secret(ctx.state_dir)
    if args.url:
        ctx.out(f"{listen.origin()}/?token={secret}")
        return 0
    sock = bind(listen)
    port = int(sock.getsockname()[1])
    origin = listen.origin(port)
    access = Access(
        keys=Keys(secret),
        hosts=allowed_hosts(listen, port, args.allow_host),
        pages_need_secret=args.require_secret or not listen.loopback,
        cookie=cookie_name(port),
        origin=origin,
    )
    what = "the HTTP API" if args.api_only else ctx.state_dir
    ctx.out(f"dispatch web: serving {what} on {origin}/")
    if ctx.environ.get("JOURNAL_STREAM"):
        # stdout is the journal: a log must never hold the secret.
        ctx.out("dispatch web: sign in with the link 'dispatch web --url' prints")
    else:
        ctx.out(f"dispatch web: sign in: {origin}/?token={secret}")
    ctx.out(f"dispatch web: API: {origin}/api/v1/ (document: {origin}/api/v1/openapi.json)")
    ctx.stdout.flush()
    site = create_site(source, access)
    started = serve(create_app(site, api_only=args.api_only), sock, on_stop=site.hub.close)
    return 0 if started else 1
