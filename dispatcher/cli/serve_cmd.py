"""``dispatch serve``: run the gateway (cron + kanban + registry) until SIGTERM.

Exit codes: 0 after a clean stop (workers keep running); 1 or 2 with one line when it cannot
start and a restart would not help (2: a bad config, a duplicate live host id, a refused
database login; 1: another serve holds the state dir, the state dir is unusable, a module is
missing); 75 to ask the supervisor for a restart when one can help (the cluster database is
down, the disk is full, an internal failure). See :mod:`dispatcher.gateway.exits`.
"""

from __future__ import annotations

import argparse
import logging

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the ``serve`` group."""
    parser = add_group(
        subparsers,
        "serve",
        common,
        description="Run cron, the kanban dispatcher and the registry follower in one process. "
        "Meant for a systemd Type=notify service (see contrib/dispatch.service); SIGTERM stops "
        "it and leaves scoped workers running, SIGHUP reloads the config.",
    )
    parser.add_argument(
        "--log-level", choices=sorted(LEVELS), default="info", help="log verbosity (stderr)"
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Validate the config, take the state dir and serve until stopped."""
    from dispatcher.cli.relay_server import start_relay
    from dispatcher.gateway.journal import configure_logging
    from dispatcher.gateway.serve import Gateway

    settings = ctx.settings  # a bad config fails here: exit 2 before anything starts
    handler = configure_logging(ctx.environ, level=LEVELS[args.log_level], stream=ctx.stderr)
    try:
        gateway = Gateway(
            settings=settings,
            state_dir=ctx.state_dir,
            environ=ctx.environ,
            config_path=ctx.config_path,
            relay=start_relay,
        )
        return gateway.run()
    finally:
        logging.getLogger("dispatch").removeHandler(handler)
