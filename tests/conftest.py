"""Shared fixtures and hooks; the machinery lives in tests/support (see docs/testing.md)."""

from __future__ import annotations

import pytest

from tests.support.leaks import leak_guard
from tests.support.postgres import cluster_db, pg_url, postgres_server
from tests.support.postgres import summary_line as postgres_summary_line
from tests.support.systemd import (
    mark_systemd_users,
    summary_line,
    systemd_manager,
    systemd_marker_gate,
)

__all__ = [
    "cluster_db",
    "leak_guard",
    "pg_url",
    "postgres_server",
    "systemd_manager",
    "systemd_marker_gate",
]

pytest_plugins = ("pytester",)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests using ``systemd_manager`` get the ``systemd`` mark before ``-m`` selects."""
    mark_systemd_users(items)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report which systemd manager and PostgreSQL server the run used."""
    terminalreporter.write_line(summary_line(terminalreporter.config))
    terminalreporter.write_line(postgres_summary_line(terminalreporter.config))
