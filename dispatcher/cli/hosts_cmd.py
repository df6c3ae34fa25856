"""`dispatch hosts`: the hosts of a cluster, their leases and clock skew.

``dispatch hosts [--json]`` lists every host that ever joined the cluster database named by
``cluster.database`` (or ``DISPATCH_DATABASE_URL``): host id, boot id, version, last heartbeat,
lease state (``live`` or ``expired``, on the database clock), epoch, open runs and the clock
skew the host measured. Without a cluster database it says so and exits 2.
"""

from __future__ import annotations

import argparse

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group
from scope.foundation.errors import UsageError

DESCRIPTION = (
    "List the hosts of the cluster database: lease state (live or expired, on the database "
    "clock), last heartbeat, epoch, open runs and measured clock skew."
)


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `hosts` command."""
    parser = add_group(subparsers, "hosts", common, description=DESCRIPTION)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """List the hosts."""
    from dispatcher.app.clusterstate import cluster_url, open_cluster_state
    from dispatcher.app.documents import hosts_document

    url = cluster_url(ctx.settings, ctx.environ)
    if url is None and ctx.config_problem is not None:
        raise UsageError(
            "the cluster database is unknown while the config cannot be read",
            remedy="fix the config, or name the database with DISPATCH_DATABASE_URL",
        )
    if url is None:
        raise UsageError(
            "no cluster database is configured (this host runs alone on SQLite)",
            remedy="set cluster.database in config.yaml or DISPATCH_DATABASE_URL",
        )
    with open_cluster_state(ctx.settings, ctx.state_dir, ctx.environ) as state:
        assert state.hosts is not None
        rows = state.hosts.rows()
        hosts = hosts_document(state, rows)
    if ctx.json:
        ctx.emit_json(hosts)
        return 0
    if not hosts:
        ctx.out("no host has joined this cluster yet")
        return 0
    times = ctx.times()
    ctx.out(
        f"{'HOST':<16} {'BOOT ID':<13} {'VERSION':<8} {'LEASE':<8} {'HEARTBEAT':<12} "
        f"{'EPOCH':>5} {'RUNS':>5} {'SKEW':>8}"
    )
    for row, shown in zip(rows, hosts, strict=True):
        skew = "-" if row.skew is None else f"{row.skew:+.2f}s"
        ctx.out(
            f"{row.host_id:<16} {row.boot_id[:13]:<13} {row.version:<8} {shown['lease']:<8} "
            f"{times.ago(row.heartbeat_at):<12} {row.epoch:>5} {shown['running_runs']:>5} "
            f"{skew:>8}"
        )
    return 0
