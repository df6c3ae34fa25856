"""Leak checks for tests: file descriptors, threads and child processes must return to baseline.

``leak_guard`` (function scope, opt-in) snapshots the process before the test and, after it,
polls for a bounded time until nothing new remains; otherwise the test fails naming each leak
(fd targets, thread names, child command lines). Processes and fds that session-scoped fixtures
own are part of the baseline: the guard sets those fixtures up *before* taking its snapshot, so
the order in which a test lists its fixtures does not matter.

Zombie children count as gone: the process is dead, only its exit status awaits collection (the
keeper or a library may reap later). Fixtures the test requests at run time with
``request.getfixturevalue`` cannot be foreseen; request them as arguments instead.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

__all__ = ["LeakGuard", "Snapshot", "find_leaks", "leak_guard", "take_snapshot"]

#: Default bound for the after-test poll; generous for a slow CI host, instant when clean.
DEFAULT_TIMEOUT = 5.0


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """What the process holds at one moment."""

    #: fd number -> readlink target (``/dev/null``, ``pipe:[123]``, ``socket:[456]``).
    fds: dict[int, str]
    #: OS thread id (``native_id``) -> name, for live Python threads.
    threads: dict[int, str]
    #: OS thread id -> comm, for every task of this process (catches threads C code started).
    tasks: dict[int, str]
    #: (pid, create time) -> command line, for live (non-zombie) descendants.
    children: dict[tuple[int, float], str]


def _fds() -> dict[int, str]:
    fds: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            # The directory fd listdir used is listed but already closed by now.
            continue
    return fds


def _tasks() -> dict[int, str]:
    tasks: dict[int, str] = {}
    for name in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{name}/comm") as f:
                tasks[int(name)] = f.read().strip()
        except OSError:
            continue  # the thread ended while we listed
    return tasks


def _children() -> dict[tuple[int, float], str]:
    children: dict[tuple[int, float], str] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            with child.oneshot():
                if child.status() == psutil.STATUS_ZOMBIE:
                    continue
                key = (child.pid, child.create_time())
                children[key] = " ".join(child.cmdline()) or f"[{child.name()}]"
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return children


def take_snapshot() -> Snapshot:
    """Snapshot open fds, threads (Python and OS) and live descendants of this process."""
    return Snapshot(
        fds=_fds(),
        threads={t.native_id: t.name for t in threading.enumerate() if t.native_id is not None},
        tasks=_tasks(),
        children=_children(),
    )


def find_leaks(baseline: Snapshot, now: Snapshot) -> list[str]:
    """Describe everything in ``now`` that ``baseline`` did not have; empty when clean.

    An fd counts as new when its number is new or now points elsewhere (closed and reused for
    something else). OS threads that are Python threads are reported once, by Python name.
    """
    leaks: list[str] = []
    for fd, target in sorted(now.fds.items()):
        if baseline.fds.get(fd) != target:
            leaks.append(f"fd {fd} -> {target}")
    for tid, name in sorted(now.threads.items()):
        if tid not in baseline.threads:
            leaks.append(f"thread {name!r} (tid {tid})")
    for tid, comm in sorted(now.tasks.items()):
        if tid not in baseline.tasks and tid not in now.threads:
            leaks.append(f"OS thread {tid} ({comm!r}, not a Python thread)")
    for key, cmdline in sorted(now.children.items()):
        if key not in baseline.children:
            leaks.append(f"child pid {key[0]}: {cmdline}")
    return leaks


@dataclass(kw_only=True)
class LeakGuard:
    """A baseline plus the check against it; what the ``leak_guard`` fixture yields.

    A test may set ``grace`` to change how long the fixture waits for things to wind down.
    """

    baseline: Snapshot
    grace: float = DEFAULT_TIMEOUT

    @classmethod
    def start(cls) -> LeakGuard:
        """Take the baseline now."""
        return cls(baseline=take_snapshot())

    def leaks(self) -> list[str]:
        """What leaked compared with the baseline, right now (no waiting)."""
        return find_leaks(self.baseline, take_snapshot())

    def check(self, timeout: float = DEFAULT_TIMEOUT, interval: float = 0.05) -> list[str]:
        """Poll until nothing leaks or ``timeout`` passes; return what still leaks (or [])."""
        # Unreachable cycles may still hold a socket or a thread's last reference; collect them
        # so the verdict does not depend on when the garbage collector last ran.
        gc.collect()
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            found = self.leaks()
            if not found:
                return []
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                gc.collect()
                return self.leaks()
            # A bounded poll: threads join and children exit asynchronously after a test.
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, interval)


def _set_up_wider_fixtures(request: pytest.FixtureRequest) -> None:
    """Set up every non-function-scoped fixture the test uses before the baseline is taken.

    pytest already orders wider scopes first for fixtures named as arguments; this also covers
    autouse or transitive ones whose order might otherwise put them inside the window.
    """
    manager = request._fixturemanager  # no public API tells a fixture's scope by name
    for name in request.fixturenames:
        if name in ("request", "leak_guard"):
            continue
        defs = manager.getfixturedefs(name, request.node)
        if defs and defs[-1].scope != "function":
            request.getfixturevalue(name)


@pytest.fixture
def leak_guard(request: pytest.FixtureRequest) -> Iterator[LeakGuard]:
    """Fail the test if it leaves fds, threads or child processes behind (bounded poll)."""
    _set_up_wider_fixtures(request)
    guard = LeakGuard.start()
    yield guard
    leaked = guard.check(guard.grace)
    if leaked:
        pytest.fail(
            f"leaked after {request.node.nodeid} ({guard.grace:g} s grace):\n  "
            + "\n  ".join(leaked),
            pytrace=False,
        )
