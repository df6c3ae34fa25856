"""The start-up budget, guarded by what a command imports (not by timing it).

Every oneshot tick, cron fire and completion pays the CLI's start-up, so each command imports
only what it needs (issues 14 and 26). The figures themselves are in ``python -m
tests.benchmarks`` (cli_startup, with its targets); this test fails when a heavy module creeps
into a path that must not need it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import runpy, sys
sys.argv = ["dispatch", *sys.argv[1:]]
try:
    runpy.run_module("dispatcher.cli.main", run_name="__main__")
except SystemExit:
    pass
sys.stderr.write("\\n".join(sorted(sys.modules)))
"""
HEAVY = {"sqlite3", "yaml", "dbus_next", "apscheduler", "psycopg", "psutil", "argcomplete"}


def imported(tmp_path: Path, *argv: str, extra: dict[str, str] | None = None) -> set[str]:
    config = tmp_path / "config.yaml"
    if not config.exists():  # rewriting it would make the config snapshot stale
        config.write_text("kanban:\n  assignees:\n    w:\n      command: [sh, -c, ':']\n")
    env = {
        **os.environ,
        "DISPATCH_CONFIG": str(config),
        "DISPATCH_STATE_DIR": str(tmp_path / "state"),
        "PYTHONPATH": str(ROOT),
        **(extra or {}),
    }
    env.pop("_ARGCOMPLETE", None)
    env.pop("DISPATCH_FAST_PATH", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    return set(done.stderr.split("\n"))


def top(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_version_imports_no_parser_no_database_no_config(tmp_path: Path) -> None:
    modules = imported(tmp_path, "--version")
    assert "dispatcher.cli" in modules  # the probe really ran the CLI
    assert not top(modules) & (HEAVY | {"argparse", "logging", "json", "typing", "dataclasses"})
    assert not {m for m in modules if m.startswith(("registry", "dispatcher.app"))}


def test_help_needs_the_parser_only(tmp_path: Path) -> None:
    modules = imported(tmp_path, "--help")
    assert "argparse" in modules
    assert not top(modules) & HEAVY
    assert "shutil" not in modules  # argparse's formatter would import it (and bz2, lzma)


@pytest.mark.parametrize(
    "argv", [("kanban", "add", "x", "--assignee", "w"), ("kanban", "list"), ("ps",)]
)
def test_commands_never_import_the_bus_the_scheduler_or_the_cluster_driver(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    modules = imported(tmp_path, *argv)
    assert "sqlite3" in modules  # it did its work
    assert not top(modules) & {"dbus_next", "apscheduler", "psycopg", "psutil", "argcomplete"}


def test_kanban_add_does_not_import_the_dispatcher(tmp_path: Path) -> None:
    modules = imported(tmp_path, "kanban", "add", "x", "--assignee", "w")
    assert "dispatcher.kanban.board" in modules
    assert "dispatcher.kanban.tick" not in modules
    assert "registry.process" not in modules


# The fast path (issue 26): with a current config snapshot, `kanban add` and a worker's reports
# import the board and its database, and neither argparse, the config schema and its YAML
# parser, logging, the scope layer nor the registry.
FAST_PATH_NEVER = {"argparse", "yaml", "logging", "dispatcher.settings", "scope.abc"}


def test_kanban_add_with_a_current_snapshot_takes_the_fast_path(tmp_path: Path) -> None:
    first = imported(tmp_path, "kanban", "add", "x", "--assignee", "w")
    assert "yaml" in first  # no snapshot yet: the config is read and validated
    assert "argparse" not in first  # but the command line is the fast path's
    modules = imported(tmp_path, "kanban", "add", "x", "--assignee", "w")
    assert "dispatcher.kanban.store" in modules and "sqlite3" in modules
    assert not (modules & FAST_PATH_NEVER)
    assert not {m for m in modules if m.startswith(("registry.process", "dispatcher.app.work"))}
    # Neither the records' vocabulary nor the history and search the board store also serves.
    assert not modules & {"dispatcher.launch.outcome", "dispatcher.buckets", "decimal"}
    assert "dispatcher.kanban.search" not in modules


def test_worker_reports_take_the_fast_path(tmp_path: Path) -> None:
    """A report on an unknown run still fails inside the board: the whole path was loaded."""
    imported(tmp_path, "kanban", "add", "x", "--assignee", "w")  # leaves the snapshot
    worker = {"DISPATCH_RUN_ID": "r_0000000000", "DISPATCH_HOST_ID": "h"}
    for argv in (
        ("kanban", "complete", "c_0000000000"),
        ("kanban", "block", "c_0000000000", "--kind", "transient", "--reason", "r"),
        ("kanban", "review", "c_0000000000"),
        ("kanban", "defer", "c_0000000000", "--for", "5m"),
    ):
        modules = imported(tmp_path, *argv, extra=worker)
        assert "dispatcher.kanban.store" in modules, argv
        assert not (modules & FAST_PATH_NEVER), (argv, modules & FAST_PATH_NEVER)


def test_other_commands_never_load_the_snapshot(tmp_path: Path) -> None:
    for argv in (("ps",), ("--help",), ("cron", "list")):
        modules = imported(tmp_path, *argv)
        assert not {"dispatcher.app.snapshot", "dispatcher.cli.kanban_writes"} & modules, argv
