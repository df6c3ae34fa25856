"""The leak guard catches leaked fds, threads and children, and lets clean tests pass."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import psutil
import pytest

from tests.support.leaks import LeakGuard, find_leaks, take_snapshot
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[1]

# Short grace for checks expected to find a leak; the default 5 s is for real tests.
QUICK = 0.2


def test_clean_code_has_no_leaks() -> None:
    guard = LeakGuard.start()
    with open(os.devnull) as f:
        f.read()
    assert guard.check(timeout=QUICK) == []


def test_leaked_fd_is_named_by_target() -> None:
    guard = LeakGuard.start()
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        assert guard.check(timeout=QUICK) == [f"fd {fd} -> /dev/null"]
    finally:
        os.close(fd)
    assert guard.check(timeout=QUICK) == []


def test_fd_number_reused_for_something_else_counts() -> None:
    read_end, write_end = os.pipe()
    try:
        baseline = take_snapshot()
        os.close(write_end)
        reused = os.open(os.devnull, os.O_RDONLY)
        try:
            assert reused == write_end  # the lowest free number is reused
            assert find_leaks(baseline, take_snapshot()) == [f"fd {reused} -> /dev/null"]
        finally:
            os.close(reused)
    finally:
        os.close(read_end)


def test_leaked_thread_is_named() -> None:
    guard = LeakGuard.start()
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="leaky-worker", daemon=True)
    thread.start()
    try:
        (leak,) = guard.check(timeout=QUICK)
        assert leak.startswith("thread 'leaky-worker'")
    finally:
        release.set()
        thread.join(timeout=5)
    assert guard.check(timeout=QUICK) == []


def test_thread_ending_within_grace_is_not_a_leak() -> None:
    guard = LeakGuard.start()
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="finishing", daemon=True)
    thread.start()
    # Let go from another thread once the check is already polling.
    threading.Timer(0.1, release.set).start()
    assert guard.check(timeout=5.0) == []


def test_leaked_child_is_named_by_cmdline() -> None:
    guard = LeakGuard.start()
    child = subprocess.Popen(["sleep", "30"])
    try:
        leaks = guard.check(timeout=QUICK)
        assert leaks == [f"child pid {child.pid}: sleep 30"]
    finally:
        child.kill()
        child.wait(timeout=5)
    assert guard.check(timeout=QUICK) == []


def test_zombie_child_counts_as_gone() -> None:
    guard = LeakGuard.start()
    child = subprocess.Popen(["true"])
    try:
        wait_for(
            lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE,
            what="the child to exit (unreaped)",
        )
        assert guard.check(timeout=QUICK) == []
    finally:
        child.wait(timeout=5)


def test_fixture_fails_a_leaking_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A subprocess, so the fd the inner test leaks on purpose does not stay open in this one.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest("from tests.support.leaks import leak_guard\n")
    pytester.makepyfile(
        test_inner="""
        import os

        def test_leaks_fd(leak_guard):
            leak_guard.grace = 0.2
            test_leaks_fd.fd = os.open(os.devnull, os.O_RDONLY)

        def test_clean(leak_guard):
            os.close(os.open(os.devnull, os.O_RDONLY))
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["*leaked after test_inner.py::test_leaks_fd (0.2 s grace):", "*fd * -> /dev/null"]
    )


def test_session_fixtures_are_baseline_in_any_order(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session fixture's child is not a leak, whichever order the test names its fixtures."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest(
        """
        import subprocess
        import pytest
        from tests.support.leaks import leak_guard

        @pytest.fixture(scope="session")
        def session_child():
            child = subprocess.Popen(["sleep", "60"])
            yield child
            child.kill()
            child.wait(timeout=5)

        @pytest.fixture
        def via_function(session_child):
            return session_child
        """
    )
    pytester.makepyfile(
        test_inner="""
        def test_guard_first(leak_guard, via_function):
            leak_guard.grace = 0.2

        def test_guard_last(session_child, leak_guard):
            leak_guard.grace = 0.2
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(passed=2)
