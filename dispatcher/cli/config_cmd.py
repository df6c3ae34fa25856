"""`dispatch config check [FILE]` and `dispatch config show`."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group, add_subgroups, path_arg
from dispatcher.config import load_config
from scope.foundation.errors import ConfigError


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the ``config`` group."""
    parser = add_group(subparsers, "config", common, help="Validate or show the configuration.")
    subs = add_subgroups(parser, "config_command")
    check = subs.add_parser(
        "check",
        parents=[common],
        help="Validate a config file without side effects (exit 2 on errors).",
        description="Validate FILE (default: the config dispatch would use) without touching "
        "the state dir. Errors name the file and line; exit 2.",
    )
    check.add_argument("file", nargs="?", type=path_arg, metavar="FILE", help="the file to check")
    check.set_defaults(handler=handle_check)
    show = subs.add_parser(
        "show",
        parents=[common],
        help="Print the effective configuration with defaults filled in.",
    )
    show.set_defaults(handler=handle_show)


def handle_check(args: argparse.Namespace, ctx: Context) -> int:
    """Validate and summarise."""
    if args.file:
        path = Path(args.file).expanduser()
        if not path.exists():
            raise ConfigError("config file not found", path=str(path))
        loaded = load_config(path)
    else:
        loaded = ctx.config
    settings = loaded.settings
    summary = {
        "ok": True,
        "path": str(loaded.path) if loaded.path else None,
        "cron_jobs": len(settings.cron.jobs),
        "assignees": sorted(settings.kanban.assignees),
    }
    if ctx.json:
        ctx.emit_json(summary)
    else:
        ctx.out(
            f"{loaded.source}: ok ({len(settings.cron.jobs)} cron jobs, "
            f"{len(settings.kanban.assignees)} assignees)"
        )
    return 0


def handle_show(args: argparse.Namespace, ctx: Context) -> int:
    """Print the effective config."""
    loaded = ctx.config
    effective = loaded.effective()
    if ctx.json:
        ctx.emit_json({"path": str(loaded.path) if loaded.path else None, "config": effective})
        return 0
    ctx.out(f"# effective configuration from {loaded.source}")
    ctx.stdout.write(yaml.safe_dump(effective, sort_keys=False, default_flow_style=False))
    return 0
