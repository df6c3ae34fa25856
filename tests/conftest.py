"""Shared fixtures and hooks; the machinery lives in tests/support (see docs/testing.md)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from tests.support.install import summary_line as install_summary_line
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

# Property tests (tests/test_props_*.py, tests/test_cli_fuzz.py): bounded example counts, no
# deadline (this machine is shared and slow at times), no example database (nothing is written
# into the checkout). CI (DISPATCH_REQUIRE_SYSTEMD=1) runs the same examples every time;
# HYPOTHESIS_PROFILE=thorough runs many more, by hand.
settings.register_profile(
    "dispatch",
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("ci", parent=settings.get_profile("dispatch"), derandomize=True)
settings.register_profile("thorough", parent=settings.get_profile("dispatch"), max_examples=2000)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE")
    or ("ci" if os.environ.get("DISPATCH_REQUIRE_SYSTEMD") == "1" else "dispatch")
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests using ``systemd_manager`` get the ``systemd`` mark before ``-m`` selects."""
    mark_systemd_users(items)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report which systemd manager, PostgreSQL server and installed wheel the run used."""
    terminalreporter.write_line(summary_line(terminalreporter.config))
    terminalreporter.write_line(postgres_summary_line(terminalreporter.config))
    terminalreporter.write_line(install_summary_line(terminalreporter.config))
