"""How the systemd tier behaves without a manager: skip locally, fail when required.

These run an inner pytest session (pytester) with the manager forced to "host" and no host
manager present, so they need no systemd themselves and never boot one.
"""

from __future__ import annotations

import pytest

INNER_CONFTEST = """
from tests.conftest import (
    leak_guard,
    pytest_collection_modifyitems,
    pytest_terminal_summary,
    systemd_manager,
    systemd_marker_gate,
)
"""

INNER_TESTS = """
import pytest

def test_uses_fixture(systemd_manager):
    pass

@pytest.mark.systemd
def test_marked_without_fixture():
    pass

def test_plain():
    pass
"""


@pytest.fixture
def no_manager(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """An inner project whose systemd tier can only look for a host manager, which is absent."""
    monkeypatch.setenv("DISPATCH_SYSTEMD_MANAGER", "host")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(pytester.path))
    monkeypatch.delenv("DISPATCH_REQUIRE_SYSTEMD", raising=False)
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    systemd: needs systemd\n")
    pytester.makepyfile(test_inner=INNER_TESTS)
    return pytester


def test_skips_with_reason_without_manager(no_manager: pytest.Pytester) -> None:
    result = no_manager.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "systemd tier: unavailable (host: no host manager socket*",
            "*no systemd user manager: host: no host manager socket*",
        ]
    )


def test_fails_when_required(no_manager: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_REQUIRE_SYSTEMD", "1")
    result = no_manager.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(["*DISPATCH_REQUIRE_SYSTEMD=1 but no systemd user manager*"])


def test_fixture_users_are_marked_for_selection(no_manager: pytest.Pytester) -> None:
    result = no_manager.runpytest("-m", "not systemd", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, deselected=2)
    selected = no_manager.runpytest("-m", "systemd", "-p", "no:cacheprovider")
    selected.assert_outcomes(skipped=2, deselected=1)


def test_unknown_mode_is_reported(
    no_manager: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_SYSTEMD_MANAGER", "bogus")
    result = no_manager.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(
        ["*DISPATCH_SYSTEMD_MANAGER='bogus': expected auto, host or private*"]
    )
