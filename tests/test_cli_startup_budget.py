"""The start-up budget, guarded by what a command imports (not by timing it).

Every oneshot tick, cron fire and completion pays the CLI's start-up, so each command imports
only what it needs (issue 14). The figures themselves are in ``python -m tests.benchmarks``
(cli_startup); this test fails when a heavy module creeps into a path that must not need it.
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


def imported(tmp_path: Path, *argv: str) -> set[str]:
    config = tmp_path / "config.yaml"
    config.write_text("kanban:\n  assignees:\n    w:\n      command: [sh, -c, ':']\n")
    env = {
        **os.environ,
        "DISPATCH_CONFIG": str(config),
        "DISPATCH_STATE_DIR": str(tmp_path / "state"),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("_ARGCOMPLETE", None)
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
