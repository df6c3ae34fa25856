"""`dispatch config check [FILE]` and `dispatch config show`."""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group, add_subgroups, path_arg
from dispatcher.config import LoadedConfig, load_config, read_config_text
from dispatcher.settings import SCHEMA
from scope.foundation.errors import ConfigError
from scope.foundation.text import plural


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the ``config`` group."""
    parser = add_group(subparsers, "config", common, help="Validate or show the configuration.")
    subs = add_subgroups(parser, "config_command")
    check = subs.add_parser(
        "check",
        parents=[common],
        help="Validate a config file without side effects (exit 2 on errors).",
        description="Validate FILE (default: the config dispatch would use) without touching "
        "the state dir. Every error is reported, one line each naming the file and line (exit "
        "2); a cron job or assignee whose program is not on PATH is a warning (exit 0).",
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
    """Validate and summarise: every error of the file (one line each, exit 2), then one
    warning per job or assignee whose program is not found (exit 0)."""
    if args.file:
        path: Path | None = Path(args.file).expanduser()
        assert path is not None
        if not path.exists():
            raise ConfigError("config file not found", path=str(path))
    else:
        path = ctx.config_path
    errors = file_errors(path) if path is not None else []
    if errors:
        return _refused(ctx, path, errors)
    loaded = load_config(path)
    settings = loaded.settings
    # Files the config names that serve would refuse to start with.
    from dispatcher.notify.sender import secret_errors

    errors = secret_errors(settings.notify, loaded.path)
    if errors:
        return _refused(ctx, path, errors)
    warnings = program_warnings(loaded, ctx.environ)
    for warning in warnings:
        ctx.warn(f"warning: {warning}")
    summary = {
        "ok": True,
        "path": str(loaded.path) if loaded.path else None,
        "cron_jobs": len(settings.cron.jobs),
        "assignees": sorted(settings.kanban.assignees),
        "warnings": warnings,
    }
    if ctx.json:
        ctx.emit_json(summary)
    else:
        ctx.out(
            f"{loaded.source}: ok ({plural(len(settings.cron.jobs), 'cron job')}, "
            f"{plural(len(settings.kanban.assignees), 'assignee')})"
        )
    return 0


def _refused(ctx: Context, path: Path | None, errors: list[ConfigError]) -> int:
    """Every error, one line each (or one JSON document): exit 2."""
    if ctx.json:
        ctx.emit_json({"ok": False, "path": str(path), "errors": [e.to_dict() for e in errors]})
    for err in errors:
        ctx.warn(f"error: {err.message}")
    return 2


def file_errors(path: Path) -> list[ConfigError]:
    """Every error in the file (an unreadable file or broken YAML is one error)."""
    from scope.foundation.collect import config_errors
    from scope.foundation.schema import load_yaml

    try:
        text = read_config_text(path)
        located = load_yaml(text, str(path))
        if located.data is not None and not isinstance(located.data, dict):
            raise ConfigError("the top level must be a mapping of sections", path=str(path), line=1)
    except ConfigError as err:
        return [err]
    return config_errors(SCHEMA, located, str(path))


def program_warnings(loaded: LoadedConfig, environ: Mapping[str, str]) -> list[str]:
    """``FILE:LINE: cron.jobs[0].command: program 'x' not found on PATH`` for every cron job
    and kanban assignee whose program cannot be found (a typo, or a PATH the gateway lacks)."""
    from scope.foundation.schema import load_yaml

    if loaded.path is None:
        return []
    located = load_yaml(read_config_text(loaded.path), str(loaded.path))
    settings = loaded.settings
    commands: list[tuple[tuple[str | int, ...], Any]] = [
        (("cron", "jobs", i, "command"), job) for i, job in enumerate(settings.cron.jobs)
    ]
    commands += [
        (("kanban", "assignees", name, "command"), assignee)
        for name, assignee in settings.kanban.assignees.items()
    ]
    found = []
    for key_path, spec in commands:
        program = "/bin/sh" if spec.shell else spec.command[0]
        path = dict(spec.env or {}).get("PATH") or environ.get("PATH") or os.defpath
        cwd = getattr(spec, "cwd", None)
        if _findable(program, path, cwd):
            continue
        key = ".".join(str(p) for p in key_path[:2]) + "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}" for p in key_path[2:]
        )
        line = located.line_of(key_path)
        where = f"{loaded.path}:{line}" if line else str(loaded.path)
        found.append(f"{where}: {key}: program {program!r} not found on PATH")
    return found


def _findable(program: str, path: str, cwd: str | None) -> bool:
    if "/" in program:
        full = Path(cwd or ".", program).expanduser() if not program.startswith("/") else None
        target = Path(program) if full is None else full
        return target.is_file() and os.access(target, os.X_OK)
    return shutil.which(program, path=path) is not None


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
