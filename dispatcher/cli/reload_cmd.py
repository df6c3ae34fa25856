"""``dispatch reload``: make the running gateway re-read its config and report its verdict.

Meant for the unit's ``ExecReload=`` (``systemctl reload`` then fails when the file was
rejected). Exit 0: the new config is in effect; 2: the gateway rejected it (the reason is the
one line on stderr; the old config stays in effect); 1: no gateway runs on the state dir, its
identity could not be confirmed, or it gave no verdict in time. See
:mod:`dispatcher.gateway.reload`.
"""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group, int_arg
from dispatcher.cli.wait_cmd import duration_arg
from dispatcher.timefmt import iso

DEFAULT_TIMEOUT = 30.0


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the ``reload`` command."""
    parser = add_group(
        subparsers,
        "reload",
        common,
        description="Send SIGHUP to the dispatch serve of the state dir (its identity checked: "
        "pid and start time) and wait until it has re-read its config. Exit 0 when the new "
        "config is in effect, 2 when it was rejected (the reason on stderr; the old config "
        "stays), 1 when no serve answered. For ExecReload= in a systemd unit.",
    )
    parser.add_argument(
        "--pid",
        type=int_arg(1, 2**31 - 1),
        metavar="PID",
        help="only if the serve holding the state dir is this pid (ExecReload=: $MAINPID)",
    )
    parser.add_argument(
        "--timeout",
        metavar="S",
        default=None,
        help=f"how long to wait for the verdict (default {DEFAULT_TIMEOUT:g}s)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Signal, wait, report."""
    from dispatcher.gateway.reload import request_reload

    timeout = duration_arg(args.timeout)
    record = request_reload(
        ctx.state_dir,
        timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
        expect_pid=args.pid,
    )
    if ctx.json:
        ctx.emit_json(
            {
                **record.to_dict(),
                "started_at": iso(record.started_at),
                "finished_at": iso(record.finished_at),
            }
        )
    else:
        ctx.out(f"reloaded {record.source} (dispatch serve pid {record.pid})")
    return 0
