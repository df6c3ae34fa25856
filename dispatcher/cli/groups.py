"""The subcommand groups, in help order, with their one-line help.

Kept apart from the group modules so ``dispatch --help`` and ``--version`` need not import them:
only the group a command line names is imported (see :func:`dispatcher.cli.main.build_parser`).
"""

from __future__ import annotations

GROUPS: dict[str, str] = {
    "serve": "Run the gateway: cron scheduler, kanban dispatcher and registry in one process.",
    "status": "Show whether serve runs, placement, workers, cards and next cron fires.",
    "doctor": "Check the systemd user bus, manager and probe; explain placement and remedies.",
    "config": "Validate or show the configuration.",
    "run": "Start a command as a registry session (argv after --).",
    "ps": "List registry sessions.",
    "logs": "Print a session's output log (raw bytes).",
    "kill": "Kill a session (scope stop or process-group SIGTERM, grace, SIGKILL).",
    "wait": "Wait for a session to finish; exit with its result.",
    "events": "List, follow and acknowledge completion events.",
    "cron": "Cron jobs: list, next, run, history, pause, resume.",
    "kanban": "Kanban board: add, list, show, edit, tick, complete, block, board, ...",
    "hosts": "Cluster mode: the hosts sharing the cluster database, their leases and skew.",
    "state": "State database: check its integrity, back it up, restore a backup.",
    "web": "Serve the live dashboard (board, runs, logs, cron, sessions, hosts) and /metrics.",
}

VALUE_OPTIONS = ("--config", "--state-dir")
"""Global options that take a value (skipped when looking for the group name)."""


def chosen_group(argv: list[str]) -> str | None:
    """The group named on the command line, or None (help, version, or a typo)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--":
            return None
        if arg in VALUE_OPTIONS:
            skip = True
            continue
        if arg.startswith("-"):
            continue
        return arg if arg in GROUPS else None
    return None
