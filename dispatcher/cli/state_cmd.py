"""`dispatch state`: check, back up and restore the state database.

``check`` runs SQLite's integrity check (exit 1 when damaged). ``backup FILE`` copies the
database with SQLite's online backup API, consistent while ``dispatch serve`` keeps writing.
``restore FILE`` puts a backup in place; it refuses while a gateway runs on the state dir and
keeps the replaced file aside. ``migrate --to URL`` copies this host's cluster state (board,
cron ledger, pause state) into an empty cluster database (:mod:`dispatcher.cluster.migrate`):
one transaction, counts reported, a non-empty target or work still in flight refused, nothing
written on any error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group, add_subgroups, path_arg
from dispatcher.errors import GatewayError
from registry.store.backup import Integrity, backup, integrity, restore
from registry.store.database import DB_NAME


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `state` command and its subcommands."""
    parser = add_group(subparsers, "state", common)
    subs = add_subgroups(parser, "state_command")
    check = subs.add_parser(
        "check",
        parents=[common],
        help="Run SQLite's integrity check on the state database (exit 1 when damaged).",
    )
    check.set_defaults(handler=handle_check)
    save = subs.add_parser(
        "backup",
        parents=[common],
        help="Copy the state database to FILE (consistent while serve runs; mode 0600).",
    )
    save.add_argument("file", type=path_arg, help="the backup file to create (must not exist)")
    save.set_defaults(handler=handle_backup)
    back = subs.add_parser(
        "restore",
        parents=[common],
        help="Put a backup in place (serve must be stopped); the old file is kept aside.",
    )
    back.add_argument("file", type=path_arg, help="a file made by 'dispatch state backup'")
    back.set_defaults(handler=handle_restore)
    move = subs.add_parser(
        "migrate",
        parents=[common],
        help="Copy this host's board, cron ledger and pause state into an empty cluster "
        "database (serve stopped, no work in flight; the password comes from "
        "cluster.password_file or PGPASSWORD).",
    )
    move.add_argument("--to", required=True, metavar="URL", help="postgresql://USER@HOST/DB")
    move.set_defaults(handler=handle_migrate)


def _report(ctx: Context, found: Integrity, verb: str) -> None:
    if ctx.json:
        ctx.emit_json(found.to_dict())
        return
    if found.ok:
        versions = ", ".join(f"{k} v{v}" for k, v in sorted(found.versions.items()))
        ctx.out(f"{found.path}: {verb} ({found.size} bytes; {versions or 'no tables yet'})")
        return
    ctx.out(f"{found.path}: damaged")
    for problem in found.problems:
        ctx.out(f"  {problem}")


def handle_check(args: argparse.Namespace, ctx: Context) -> int:
    """Integrity check; exit 1 when damaged."""
    path = ctx.state_dir / DB_NAME
    if not path.exists():
        if ctx.json:
            ctx.emit_json({"path": str(path), "ok": True, "problems": [], "missing": True})
        else:
            ctx.out(f"{path}: no state database yet (nothing stored)")
        return 0
    found = integrity(path)
    _report(ctx, found, "ok")
    if not found.ok:
        ctx.warn(
            f"error: state database {path} is damaged; restore a backup with 'dispatch state "
            f"restore BACKUP' or move it aside ('mv {path} {path}.damaged') to start empty"
        )
    return 0 if found.ok else 1


def handle_backup(args: argparse.Namespace, ctx: Context) -> int:
    """Online backup into a new file."""
    made = backup(ctx.state_dir / DB_NAME, Path(args.file).expanduser().absolute())
    _report(ctx, made, "backup written and checked")
    return 0


def _refuse_under_serve(ctx: Context, what: str) -> None:
    from dispatcher.gateway.lock import read_holder

    holder = read_holder(ctx.state_dir)
    if holder is not None:
        raise GatewayError(
            f"dispatch serve (pid {holder.pid}) runs on {ctx.state_dir}; a {what} under it "
            "would be lost or mixed",
            remedy=f"stop it first (systemctl --user stop dispatch), then {what}",
            pid=holder.pid,
        )


def handle_restore(args: argparse.Namespace, ctx: Context) -> int:
    """Verify a backup and swap it in while no gateway runs."""
    from dispatcher.app.database import components

    _refuse_under_serve(ctx, "restore")
    source = Path(args.file).expanduser().absolute()
    aside = restore(ctx.state_dir, source, components())
    target = ctx.state_dir / DB_NAME
    if ctx.json:
        ctx.emit_json({"restored": str(target), "from": str(source), "previous": str(aside)})
    elif aside == target:
        ctx.out(f"restored {target} from {source}")
    else:
        ctx.out(f"restored {target} from {source}; the previous file is kept as {aside}")
    return 0


def handle_migrate(args: argparse.Namespace, ctx: Context) -> int:
    """Copy cluster state from this host's SQLite file into an empty cluster database."""
    from dispatcher.app.database import open_state
    from dispatcher.cluster.database import ClusterDB, password_from_file
    from dispatcher.cluster.migrate import migrate
    from dispatcher.cluster.url import check_url, redact

    url = check_url(args.to)
    _refuse_under_serve(ctx, "migrate")
    cluster = ctx.settings.cluster
    password = None
    if cluster.password_file:
        password = password_from_file(Path(cluster.password_file).expanduser())
    with open_state(ctx.state_dir) as source, ClusterDB(url, password=password, pooled=False) as db:
        db.check()
        done = migrate(source, db)
    if ctx.json:
        ctx.emit_json(
            {
                "to": redact(url),
                "counts": done.counts,
                "kanban_paused": done.paused,
                "board_version": done.board_version,
            }
        )
        return 0
    counts = ", ".join(f"{table} {count}" for table, count in done.counts.items())
    ctx.out(f"copied into {redact(url)}: {counts}" + ("; claiming paused" if done.paused else ""))
    ctx.out(
        "next: set cluster.database (and cluster.password_file) in config.yaml on every host, "
        "then start dispatch serve"
    )
    return 0
