"""Shell completion and the man page, both generated from the one argument parser.

- Completion is argcomplete's: ``dispatch completion bash|zsh|fish`` prints the shell's hook,
  which runs ``dispatch`` itself with ``_ARGCOMPLETE`` set. :func:`entry_hook` (called first
  thing by the console script) then builds the parser with the group being typed registered in
  full (every group's name and help are always there), attaches the completers for live ids
  and lets argcomplete answer and exit.
  Without ``_ARGCOMPLETE`` the hook is one dictionary lookup: ``dispatch --version`` pays
  nothing for it.
- Live ids come from the state dir the command line names (``--state-dir``, else
  ``DISPATCH_STATE_DIR``, else the default), read-only: session ids, card ids, and cron job ids
  from the config. A completer never creates a state dir, migrates a database or prints.
- ``dispatch manpage`` prints ``dispatch(1)`` in roff, made by argparse-manpage from the same
  parser, so every command and option in ``--help`` is in the page.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

SHELLS = ("bash", "zsh", "fish")
LIMIT = 200
"""At most this many ids are offered (the newest first)."""

Completer = Callable[..., Iterable[str]]


def entry_hook(environ: Mapping[str, str] | None = None) -> None:
    """When a shell asks for completions (``_ARGCOMPLETE`` set), answer and exit."""
    env = os.environ if environ is None else environ
    if "_ARGCOMPLETE" not in env:
        return
    import argcomplete

    from dispatcher.cli.main import build_parser

    # The group the line names is registered in full (the others keep their placeholders,
    # which carry their names and help): a TAB pays for one command module, not all of them.
    parser = build_parser(_typed_words(env))
    attach_completers(parser)
    argcomplete.autocomplete(parser)  # exits after answering
    raise SystemExit(0)  # not reached unless argcomplete declined (a broken hook): no output


def _typed_words(env: Mapping[str, str]) -> list[str]:
    """The words typed so far after ``dispatch`` (as the shell's hook reports them)."""
    import shlex

    line = env.get("COMP_LINE", "")
    try:
        point = int(env.get("COMP_POINT", len(line)))
    except ValueError:
        point = len(line)
    try:
        words = shlex.split(line[:point])
    except ValueError:  # an open quote: good enough for finding the group
        words = line[:point].split()
    return words[1:]


def shell_code(shell: str) -> str:
    """The hook ``dispatch completion SHELL`` prints."""
    import argcomplete

    return str(argcomplete.shellcode(["dispatch"], shell=shell))


def manpage() -> str:
    """``dispatch(1)`` in roff, generated from the full parser."""
    from argparse_manpage.manpage import Manpage

    from dispatcher import __version__
    from dispatcher.cli.main import build_parser

    parser = build_parser()
    data = {
        "project_name": "dispatch",
        "version": __version__,
        "manual_title": "dispatch manual",
        "manual_section": 1,
        "description": parser.description,
    }
    page = Manpage(parser, _data=data, format="pretty")
    for heading, content in _SECTIONS:
        page.add_section(heading, "=", content)
    return str(page)


_SECTIONS = (
    (
        "exit status",
        "0 success; 1 the operation failed or a check is unhealthy; 2 usage error, config "
        "error, unknown or ambiguous id (one line on stderr); 75 serve asks its supervisor for "
        "a restart; 141 stdout was closed early. run --wait, run --follow, wait and logs -f "
        "pass the worker's result through: its exit code, 128+N for signal N, 124 when "
        "--timeout elapsed, 127 when it could not start, 130 on Ctrl-C.",
    ),
    (
        "environment",
        "DISPATCH_CONFIG (the config file), DISPATCH_STATE_DIR (the state dir), "
        "XDG_CONFIG_HOME and XDG_STATE_HOME (their defaults), XDG_RUNTIME_DIR and "
        "DBUS_SESSION_BUS_ADDRESS (the systemd user manager's bus), TZ (the zone times are "
        "shown in).",
    ),
    (
        "files",
        "~/.config/dispatch/config.yaml (the config), ~/.local/state/dispatch/ (the state "
        "dir: state.db, sessions/, serve.json, reload.json), contrib/dispatch.service, "
        "contrib/dispatch@.service and contrib/dispatch-kanban-tick.service (systemd units).",
    ),
    (
        "see also",
        "systemd.service(5), systemd-run(1), loginctl(1); docs/quickstart.md, "
        "docs/systemd.md and docs/troubleshooting.md in the source tree.",
    ),
)


# -- completers for live ids -------------------------------------------------------------------


def _state_db(parsed_args: argparse.Namespace) -> Path | None:
    from dispatcher.paths import resolve_state_dir

    path = resolve_state_dir(getattr(parsed_args, "state_dir", None), os.environ) / "state.db"
    return path if path.is_file() else None


def _ids(parsed_args: argparse.Namespace, sql: str) -> list[str]:
    db = _state_db(parsed_args)
    if db is None:
        return []
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return [str(row[0]) for row in conn.execute(sql, (LIMIT,)).fetchall()]
        finally:
            conn.close()
    except sqlite3.Error:
        return []  # a completer must never fail loudly in the middle of a command line


def complete_sessions(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Session ids, running ones first, then the newest."""
    found = _ids(
        parsed_args,
        "SELECT id FROM registry_sessions ORDER BY (state = 'running') DESC, started_at DESC"
        " LIMIT ?",
    )
    return [i for i in found if i.startswith(prefix)]


def complete_cards(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Card ids (not archived), the most recently updated first."""
    found = _ids(
        parsed_args,
        "SELECT id FROM kanban_cards WHERE status != 'archived' ORDER BY updated_at DESC LIMIT ?",
    )
    return [i for i in found if i.startswith(prefix)]


def complete_jobs(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Cron job ids from the config (and the ledger, for jobs removed from it)."""
    from dispatcher.config import load_config, resolve_config_path
    from scope.foundation.errors import DispatchError

    jobs: set[str] = set()
    try:
        path = resolve_config_path(getattr(parsed_args, "config", None), os.environ)
        jobs.update(job.id for job in load_config(path).settings.cron.jobs)
    except DispatchError:
        pass
    jobs.update(_ids(parsed_args, "SELECT job_id FROM cron_jobs LIMIT ?"))
    return sorted(j for j in jobs if j.startswith(prefix))


def complete_assignees(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """kanban.assignees names from the config."""
    from dispatcher.config import load_config, resolve_config_path
    from scope.foundation.errors import DispatchError

    try:
        path = resolve_config_path(getattr(parsed_args, "config", None), os.environ)
        names = load_config(path).settings.kanban.assignees
    except DispatchError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


COMPLETERS: dict[tuple[str, str], Completer] = {
    ("logs", "id"): complete_sessions,
    ("wait", "id"): complete_sessions,
    ("kill", "id"): complete_sessions,
    ("events", "session"): complete_sessions,
    ("kanban", "id"): complete_cards,
    ("kanban", "parent"): complete_cards,
    ("kanban", "assignee"): complete_assignees,
    ("cron", "job_id"): complete_jobs,
}
"""(group, argument dest) -> completer; every subcommand of the group shares it."""


def attach_completers(parser: argparse.ArgumentParser, group: str | None = None) -> None:
    """Set argcomplete's ``completer`` on every argument :data:`COMPLETERS` names."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                attach_completers(sub, group or name)
        elif group is not None and (group, action.dest) in COMPLETERS:
            action.completer = COMPLETERS[(group, action.dest)]  # type: ignore[attr-defined]


# -- the commands ------------------------------------------------------------------------------


def print_text(text: str) -> None:
    """Write generated text to stdout as it is."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
