"""Kanban on a real systemd user manager: the oneshot drill (workers outlive the tick's unit in
their own scopes) and infrastructure refusals while the manager is unreachable."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.app.runtime import open_runtime
from dispatcher.app.workspace import Workspace
from dispatcher.config import load_config
from dispatcher.kanban.lookup import resolve_session_id
from dispatcher.kanban.model import CardStatus
from dispatcher.kanban.tick import KanbanDispatcher
from dispatcher.launch.outcome import Outcome
from scope.abc import CallerKind
from scope.foundation.clock import FakeClock
from tests.support.cli import dispatch_argv
from tests.support.systemd import SystemdManager

pytestmark = pytest.mark.systemd

# Each worker waits for the test's go-ahead, so "still running after the unit is gone" is a
# fact the test controls rather than a race against a sleep.
WORKER = 'while [ ! -e "$RELEASE" ]; do sleep 0.05; done; echo "out $DISPATCH_CARD_ID"'


def write_config(home: Path, *, degrade: bool = False, cooldown: str = "5m") -> Path:
    release = home / "release"
    config = home / "config.yaml"
    config.write_text(
        "kanban:\n"
        f"  degrade_without_scope: {'true' if degrade else 'false'}\n"
        f"  infrastructure_cooldown: {cooldown}\n"
        "  max_in_progress: 50\n"
        "  assignees:\n"
        "    w:\n"
        f"      command: [sh, -c, {json.dumps(WORKER)}]\n"
        f"      env: {{RELEASE: {json.dumps(str(release))}}}\n"
    )
    return config


def workspace(home: Path, env: dict[str, str]) -> Workspace:
    config = home / "config.yaml"
    return Workspace(load_config(config).settings, home / "state", environ=env, config_path=config)


@pytest.fixture
def home(tmp_path: Path, systemd_manager: SystemdManager) -> Iterator[Path]:
    yield tmp_path
    # Release any worker a failed assertion left waiting.
    (tmp_path / "release").touch()


def test_oneshot_drill(home: Path, systemd_manager: SystemdManager) -> None:
    manager = systemd_manager
    config = write_config(home)
    env = dict(manager.env)
    board = workspace(home, env)
    try:
        card_ids = [
            board.board.add(f"card {i}", assignee="w", now=board.now())[0].id for i in range(20)
        ]
    finally:
        board.close()
    out = home / "tick.out"
    unit = manager.run_transient_service(
        dispatch_argv(config, home / "state", "kanban", "tick", "--json"),
        env={"HOME": str(home)},
        type="oneshot",
        properties={"StandardOutput": f"file:{out}", "StandardError": f"file:{home / 'tick.err'}"},
        cwd=home,
        timeout=120,
    )
    # Type=oneshot: systemd-run returned after the tick exited; the unit is gone or inactive.
    manager.wait_for(
        lambda: manager.unit_property(unit, "ActiveState") in ("inactive", ""),
        timeout=10,
        what="the oneshot unit to be inactive",
    )
    report = json.loads(out.read_text())
    assert len(report["dispatched"]) == 20, (home / "tick.err").read_text()
    assert {d["placement"] for d in report["dispatched"]} == {"scoped"}

    board = workspace(home, env)
    try:
        board.refresh()
        for card_id in card_ids:
            card = board.store.get_card(card_id)
            assert card.status is CardStatus.RUNNING
            (run,) = board.store.runs_of(card_id)
            assert run.unit and run.placement == "scoped"
            assert manager.unit_pids(run.unit), f"{run.unit} has no processes left"
        (home / "release").touch()

        def all_done() -> bool:
            board.refresh()
            return all(c.status is CardStatus.DONE for c in board.store.list_cards())

        manager.wait_for(all_done, timeout=30, interval=0.2, what="20 cards done")
        registry = board.registry()
        for card_id in card_ids:
            (run,) = board.store.runs_of(card_id)
            assert run.outcome is Outcome.COMPLETED and run.exit_code == 0
            session_id = resolve_session_id(board.store, card_id)
            assert session_id == run.session_id
            assert registry.read_log(session_id) == f"out {card_id}\n".encode()
    finally:
        board.close()
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher.cli.main",
            "--state-dir",
            str(home / "state"),
            "logs",
            str(run.session_id),
        ],
        capture_output=True,
        timeout=60,
        env={**env, "HOME": str(home)},
    )
    assert shown.returncode == 0 and shown.stdout == f"out {card_ids[-1]}\n".encode()


def test_an_unreachable_manager_refuses_without_counting(
    home: Path, systemd_manager: SystemdManager
) -> None:
    manager = systemd_manager
    config = write_config(home)
    settings = load_config(config).settings
    # INVOCATION_ID: the dispatcher behaves as if it ran inside a service (a teardown unit).
    env = {**manager.env, "INVOCATION_ID": "0123456789abcdef"}
    clock = FakeClock()
    board = workspace(home, env)
    runtime = open_runtime(
        settings, home / "state", env, caller_kind=CallerKind.ONESHOT, clock=clock
    )
    try:
        dispatcher = KanbanDispatcher(
            store=board.store,
            registry=runtime.registry,
            settings=settings.kanban,
            state_dir=home / "state",
            caller=CallerKind.ONESHOT,
            environ=env,
            scoper=runtime.scoper,
            config_path=config,
        )
        card_id = board.board.add("infra", assignee="w", now=clock.time())[0].id
        with manager.manager_unreachable():
            for attempt in range(3):
                if attempt:
                    clock.advance(301)  # past kanban.infrastructure_cooldown
                report = dispatcher.tick(clock.time())
                assert [c.infrastructure for c in report.refused] == [True]
            card = board.store.get_card(card_id)
            assert card.status is CardStatus.READY and card.consecutive_failures == 0
            assert "linger" in (card.last_failure_error or "")
            runs = board.store.runs_of(card_id)
            assert [(r.outcome, r.infrastructure) for r in runs] == [
                (Outcome.SPAWN_REFUSED, True)
            ] * 3
            # Inside the cooldown nothing is attempted; the skip is recorded.
            clock.advance(10)
            report = dispatcher.tick(clock.time())
            assert report.guarded == (card_id,) and len(board.store.runs_of(card_id)) == 3
        report = dispatcher.tick(clock.time())
        assert [d.card_id for d in report.dispatched] == [card_id]
        assert report.dispatched[0].placement == "scoped"
        (home / "release").touch()
        session_id = report.dispatched[0].session_id
        manager.wait_for(
            lambda: runtime.registry.get(session_id).finished, timeout=20, what="worker exit"
        )
        dispatcher.tick(clock.time())
        card = board.store.get_card(card_id)
        assert card.status is CardStatus.DONE and card.consecutive_failures == 0
    finally:
        runtime.close()
        board.close()


def test_degraded_oneshot_warns_about_the_unit(home: Path, systemd_manager: SystemdManager) -> None:
    manager = systemd_manager
    config = write_config(home, degrade=True)
    env = {**manager.env, "INVOCATION_ID": "0123456789abcdef"}
    board = workspace(home, env)
    try:
        board.board.add("degraded", assignee="w", now=board.now())
    finally:
        board.close()
    (home / "release").touch()  # the worker may end at once: only the warning matters here
    with manager.manager_unreachable():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dispatcher.cli.main",
                "--config",
                str(config),
                "--state-dir",
                str(home / "state"),
                "kanban",
                "tick",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "HOME": str(home)},
        )
    assert done.returncode == 0, done.stderr
    assert "(degraded)" in done.stdout
    assert "KillMode=process" in done.stderr and "linger" in done.stderr
