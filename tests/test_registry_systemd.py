"""ProcessRegistry with real systemd scopes (the real-systemd tier), over both keeper start
paths: a keeper forked by the fork server is placed into its scope by pid like any other."""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.abc import SessionState
from registry.process import ProcessRegistry
from scope import open_scoper
from scope.abc import BackendKind, Placement, Policy, Scoper
from scope.settings import ScopeSettings
from tests.support.keepers import over_both_start_paths  # noqa: F401 - autouse, parametrized
from tests.support.systemd import SystemdManager
from tests.support.wait import wait_for
from tests.test_registry_support import (
    DOUBLE_FORK,
    IGNORES_TERM,
    open_registry,
    request,
    session_pids,
    start_launcher,
    stop_all,
)

pytestmark = pytest.mark.systemd


def _scoper(manager: SystemdManager) -> Scoper:
    return open_scoper(ScopeSettings(), Policy(), environ=manager.env)


@pytest.fixture
def scoped_registry(tmp_path: Path, systemd_manager: SystemdManager) -> Iterator[ProcessRegistry]:
    scoper = open_scoper(ScopeSettings(), Policy(), environ=systemd_manager.env)
    try:
        with open_registry(tmp_path / "state", scoper) as registry:
            yield registry
    finally:
        scoper.close()


def test_scoped_session_runs_in_its_own_scope(
    scoped_registry: ProcessRegistry, systemd_manager: SystemdManager
) -> None:
    session = scoped_registry.spawn(request(["sh", "-c", "cat /proc/self/cgroup; exit 3"]))
    assert session.placement is Placement.SCOPED
    assert session.unit and session.unit.endswith(".scope") and session.id in session.unit
    done = scoped_registry.wait(session.id, timeout=15).snapshot
    assert done.session.exit_code == 3
    assert session.unit in done.output
    wait_for(lambda: systemd_manager.unit_pids(session.unit or "") == [], 10, what="scope gone")


def test_a_session_placed_by_systemd_run_runs_and_is_recorded(
    tmp_path: Path, systemd_manager: SystemdManager
) -> None:
    """systemd-run execs the keeper in its scope with the descriptors it inherited: the ready
    pipe and the record gate reach it, so the worker starts and the row knows who runs."""
    settings = ScopeSettings(backend=BackendKind.SYSTEMD_RUN)
    scoper = open_scoper(settings, Policy(), environ=systemd_manager.env)
    try:
        with open_registry(tmp_path / "state", scoper) as registry:
            session = registry.spawn(request(["sh", "-c", "echo ran; exit 4"]))
            assert session.placement is Placement.SCOPED and session.keeper_pid
            done = registry.wait(session.id, timeout=15).snapshot
            assert done.session.exit_code == 4 and done.output == "ran\n"
            assert done.session.worker_pid is not None
    finally:
        scoper.close()


@pytest.mark.parametrize(
    ("argv", "pty", "signals"),
    [
        (IGNORES_TERM, False, {"SIGKILL"}),
        (DOUBLE_FORK, False, {"SIGTERM", "SIGKILL"}),
        (["sh", "-c", "echo ready; exec cat"], True, {"SIGTERM", "SIGHUP"}),
    ],
    ids=["ignores-term", "double-fork", "pty"],
)
def test_kill_empties_the_scope(
    scoped_registry: ProcessRegistry,
    systemd_manager: SystemdManager,
    argv: list[str],
    pty: bool,
    signals: set[str],
) -> None:
    session = scoped_registry.spawn(request(argv, pty=pty))
    unit = session.unit or ""
    wait_for(lambda: b"ready" in scoped_registry.read_log(session.id), 10, what="ready")
    assert systemd_manager.unit_pids(unit)
    snap = scoped_registry.kill(session.id, grace=0.5)
    assert snap.session.state is SessionState.KILLED
    assert snap.session.signal in signals
    assert systemd_manager.unit_pids(unit) == []
    assert session_pids(session.id) == []


def test_launcher_killed_scoped_worker_finishes_and_is_adopted(
    tmp_path: Path, systemd_manager: SystemdManager
) -> None:
    state = tmp_path / "state"
    go = tmp_path / "go"
    script = f"echo before; while [ ! -e {go} ]; do sleep 0.02; done; echo after; exit 3"
    launcher, info = start_launcher(state, ["sh", "-c", script], env=systemd_manager.env)
    assert info["placement"] == "scoped"
    try:
        log = state / "sessions" / info["id"] / "output.log"
        wait_for(lambda: log.exists() and log.read_bytes() == b"before\n", 10, what="output")
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        assert systemd_manager.unit_pids(info["unit"])  # the keeper and worker live on
        go.touch()
        scoper = open_scoper(ScopeSettings(), Policy(), environ=systemd_manager.env)
        try:
            with open_registry(state, scoper) as registry:
                registry.adopt()
                done = registry.wait(info["id"], timeout=15).snapshot
                assert done.session.state is SessionState.EXITED
                assert done.session.exit_code == 3
                assert done.session.finished_at is not None
                assert done.output == "before\nafter\n"
                assert registry.read_log(info["id"]) == b"before\nafter\n"
        finally:
            scoper.close()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        cleanup = _scoper(systemd_manager)
        try:
            stop_all(state, cleanup)
        finally:
            cleanup.close()


def test_a_placement_the_launcher_never_recorded_is_learned_from_the_keepers_cgroup(
    tmp_path: Path, systemd_manager: SystemdManager
) -> None:
    """A launcher killed between opening the keeper's gate and recording the placement leaves
    a draft row (in process, no unit, no keeper) for a worker that runs in its scope. Adoption
    reads the scope from the keeper's cgroup, so the kill stops the unit and confirms it empty."""
    state = tmp_path / "state"
    launcher, info = start_launcher(state, IGNORES_TERM, env=systemd_manager.env)
    try:
        log = state / "sessions" / info["id"] / "output.log"
        wait_for(lambda: log.exists() and b"ready" in log.read_bytes(), 10, what="ready")
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        with sqlite3.connect(state / "state.db") as db:  # the row as the draft left it
            db.execute(
                "UPDATE registry_sessions SET placement = 'in_process', unit = NULL,"
                " keeper_pid = NULL, keeper_start = NULL, worker_pid = NULL,"
                " worker_start = NULL WHERE id = ?",
                (info["id"],),
            )
        scoper = _scoper(systemd_manager)
        try:
            with open_registry(state, scoper) as registry:
                registry.adopt()
                session = registry.get(info["id"])
                assert session.placement is Placement.SCOPED
                assert session.unit == info["unit"]
                assert session.keeper_pid == info["keeper_pid"]
                assert session.warning and "recorded late" in session.warning
                snap = registry.kill(info["id"], grace=0.5)
                assert snap.session.state is SessionState.KILLED
                assert systemd_manager.unit_pids(info["unit"]) == []
                assert session_pids(info["id"]) == []
        finally:
            scoper.close()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        cleanup = _scoper(systemd_manager)
        try:
            stop_all(state, cleanup)
        finally:
            cleanup.close()


def test_scoped_timeout_holds_after_the_launcher_died(
    tmp_path: Path, systemd_manager: SystemdManager
) -> None:
    state = tmp_path / "state"
    launcher, info = start_launcher(state, DOUBLE_FORK, env=systemd_manager.env, timeout=0.5)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=10)
    scoper = _scoper(systemd_manager)
    try:
        with open_registry(state, scoper, follow=False) as registry:
            done = registry.wait(info["id"], timeout=15).snapshot.session
            assert done.state is SessionState.TIMED_OUT
            wait_for(lambda: systemd_manager.unit_pids(info["unit"]) == [], 10, what="empty")
            assert session_pids(info["id"]) == []
    finally:
        scoper.close()
