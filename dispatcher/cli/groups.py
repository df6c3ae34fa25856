"""The subcommand groups, in help order, with their one-line help.

Kept apart from the group modules so ``dispatch --help`` and ``--version`` need not import them:
only the group a command line names is imported (see :func:`dispatcher.cli.main.build_parser`).
"""

from __future__ import annotations

GROUPS: dict[str, str] = {
    "serve": "Run the gateway: cron scheduler, kanban dispatcher and registry in one process.",
    "reload": "Make the running serve re-read its config and wait for its verdict.",
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
    "limits": "Named limits: use, capacity, rate window and what waits for each.",
    "hosts": "Cluster mode: the hosts sharing the cluster database, their leases and skew.",
    "notify": "Notifications: list the outbox, retry a dead message, test a channel.",
    "state": "State database: check its integrity, back it up, restore a backup.",
    "web": "Serve the live dashboard (board, runs, logs, cron, sessions, hosts) and /metrics.",
    "completion": "Print the shell completion hook for bash, zsh or fish.",
    "manpage": "Print the dispatch(1) man page.",
}

READ_ONLY: dict[str, object] = {
    "status": True,
    "ps": True,
    "wait": True,
    "hosts": True,
    "limits": True,
    "doctor": True,
    "logs": lambda args: not args.redact,  # redaction patterns come from the config
    "events": lambda args: not args.ack,
    "kanban list": True,
    "kanban show": True,
    "kanban board": True,
    "cron list": True,
    "cron history": True,
    "state check": True,
    "notify list": True,
    "web token": lambda args: args.token_command == "list",  # noqa: S105 - a command name
}
"""Commands that only read the state dir (by ``"group"`` or ``"group sub"``): they go on with
the built-in defaults and one warning when the config file is broken (see
:attr:`dispatcher.cli.context.Context.config`); a value may decide by the arguments."""


def read_only(command: str | None, sub: str | None, args: object) -> bool:
    """Whether the parsed command line only reads (see :data:`READ_ONLY`)."""
    flag = READ_ONLY.get(f"{command} {sub}" if sub else str(command), False)
    return bool(flag(args) if callable(flag) else flag)


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


GLOBAL_OPTIONS = ("--help", "--version", "--json", *VALUE_OPTIONS)


def unknown_global_option(argv: list[str]) -> str | None:
    """The first option before any command that ``dispatch`` itself does not know (argparse
    accepts unambiguous prefixes such as ``--vers``), or None."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--" or not arg.startswith("-"):
            return None
        if arg == "-h":
            continue
        name = arg.split("=", 1)[0]
        matches = [o for o in GLOBAL_OPTIONS if o.startswith(name) and name.startswith("--")]
        if not matches:
            return arg
        skip = name == arg and matches[0] in VALUE_OPTIONS and len(matches) == 1
    return None
