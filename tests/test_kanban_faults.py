"""Crash safety with real processes: `dispatch kanban tick` SIGKILLed at every step between
claim and recorded spawn (DISPATCH_KANBAN_FAULT), then a fresh tick. Afterwards no card is
`running` without a live keeper, no card has two live workers, and every card finishes."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dispatcher.app.runtime import open_runtime
from dispatcher.app.workspace import Workspace
from dispatcher.config import load_config
from dispatcher.kanban.faults import ENV_FAULT, STEPS
from dispatcher.kanban.model import CardStatus
from scope.abc import CallerKind
from tests.support.systemd import SystemdManager
from tests.support.wait import wait_for

# Each start appends its card id to <home>/starts: the direct record of how often a card ran.
WORKER = [
    sys.executable,
    "-c",
    "import os, time; e = os.environ; f = os.open(e['DISPATCH_STATE_DIR'] + '/../starts',"
    " os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600); os.write(f, e['DISPATCH_CARD_ID'].encode()"
    " + b'\\n'); time.sleep(0.8)",
]


def config_text() -> str:
    argv = ", ".join(json.dumps(a) for a in WORKER)
    # degrade_without_scope: a test runner inside a systemd service must still start workers.
    return (
        f"kanban:\n  degrade_without_scope: true\n  assignees:\n    w:\n      command: [{argv}]\n"
    )


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    env.pop("INVOCATION_ID", None)
    return env


def dispatch(home: Path, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher.cli.main",
            "--config",
            str(home / "config.yaml"),
            "--state-dir",
            str(home / "state"),
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def live_workers(card_id: str) -> list[int]:
    """Pids of processes that are the worker of ``card_id`` (by its environment)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.info["cmdline"] != WORKER:
                continue
            if proc.environ().get("DISPATCH_CARD_ID") == card_id and proc.status() != "zombie":
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "config.yaml").write_text(config_text())
    yield tmp_path
    # Leave nothing behind even when an assertion failed midway.
    for proc in psutil.process_iter(["cmdline"]):
        try:
            ours = str(tmp_path) in proc.environ().get("DISPATCH_STATE_DIR", "")
            if proc.info["cmdline"] == WORKER and ours:
                proc.send_signal(signal.SIGKILL)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def check_invariants(home: Path, card_ids: list[str], env: dict[str, str]) -> None:
    settings = load_config(home / "config.yaml").settings
    workspace = Workspace(settings, home / "state", environ=env)
    runtime = open_runtime(settings, home / "state", env, caller_kind=CallerKind.ONESHOT)
    try:
        workspace.refresh()
        for card_id in card_ids:
            card = workspace.store.get_card(card_id)
            open_runs = [r for r in workspace.store.runs_of(card_id) if r.open]
            assert len(open_runs) <= 1
            assert len(live_workers(card_id)) <= 1, f"{card_id} has two live workers"
            if card.status is CardStatus.RUNNING:
                assert open_runs and open_runs[0].session_id, f"{card_id} running without keeper"
                session = runtime.registry.get(open_runs[0].session_id)
                assert not session.finished or session.exit_code == 0
    finally:
        runtime.close()
        workspace.close()


def worker_sessions(home: Path, env: dict[str, str]) -> dict[str, int]:
    """How many registry sessions started a worker, by the spawn's card label (a draft whose
    keeper was turned back at its record gate started nothing and is not counted)."""
    settings = load_config(home / "config.yaml").settings
    runtime = open_runtime(settings, home / "state", env, caller_kind=CallerKind.CLI)
    try:
        sessions = runtime.registry.list_sessions(include_finished=True)
        started = [s for s in sessions if s.worker_pid is not None]
        return dict(collections.Counter(s.labels.get("card_id", "") for s in started))
    finally:
        runtime.close()


def worker_starts(home: Path) -> dict[str, int]:
    """How many times each card's worker actually started (its own record)."""
    starts = home / "starts"
    lines = starts.read_text().split() if starts.exists() else []
    return dict(collections.Counter(lines))


def board(home: Path, env: dict[str, str]) -> dict[str, dict[str, object]]:
    settings = load_config(home / "config.yaml").settings
    workspace = Workspace(settings, home / "state", environ=env)
    try:
        workspace.refresh()
        return {
            card.id: {
                "status": card.status,
                "outcomes": [
                    r.outcome.value if r.outcome else None for r in workspace.store.runs_of(card.id)
                ],
            }
            for card in workspace.store.list_cards()
        }
    finally:
        workspace.close()


def crash_and_recover(home: Path, step: str, env: dict[str, str]) -> tuple[set[str], str]:
    """Add two cards, crash a tick at ``step``, tick again, check, wait for the end; returns
    the placements the workers got and what the two ticks wrote to stderr."""
    card_ids = []
    for title in ("first", "second"):
        added = dispatch(home, "kanban", "add", title, "--assignee", "w", env=env)
        assert added.returncode == 0, added.stderr
        card_ids.append(added.stdout.strip())

    crashed = dispatch(home, "kanban", "tick", env={**env, ENV_FAULT: step})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr

    again = dispatch(home, "kanban", "tick", "--json", env=env)
    assert again.returncode == 0, again.stderr
    check_invariants(home, card_ids, env)

    def all_done() -> dict[str, dict[str, object]] | None:
        state = board(home, env)
        return state if all(c["status"] is CardStatus.DONE for c in state.values()) else None

    final = wait_for(all_done, timeout=20, interval=0.2, what="every card done")
    outcomes = [final[card_id]["outcomes"] for card_id in card_ids]
    if step in ("claimed", "prepared"):
        # Nothing was spawned: the run is reclaimed (not counted) and started once more.
        assert outcomes[0] == ["reclaimed", "completed"]
    else:
        # A worker was spawned: it is adopted, never started a second time. Spawns overlap
        # claims, so the card whose spawn hit the fault may be either one; the other may have
        # been only claimed then, and is reclaimed (never counted).
        assert ["completed"] in outcomes, outcomes
    assert all(o in (["completed"], ["reclaimed", "completed"]) for o in outcomes), outcomes
    # Whatever was reclaimed, no card's worker was started twice: one start and one session
    # that started a worker a card.
    assert worker_starts(home) == dict.fromkeys(card_ids, 1)
    assert worker_sessions(home, env) == dict.fromkeys(card_ids, 1)
    for card_id in card_ids:
        assert live_workers(card_id) == []
    settings = load_config(home / "config.yaml").settings
    workspace = Workspace(settings, home / "state", environ=env)
    try:
        placements = {
            str(run.placement)
            for card_id in card_ids
            for run in workspace.store.runs_of(card_id)
            if run.session_id
        }
        return placements, crashed.stderr + again.stderr
    finally:
        workspace.close()


@pytest.mark.parametrize("step", STEPS)
def test_a_dispatcher_killed_at_any_step_leaves_a_consistent_board(home: Path, step: str) -> None:
    crash_and_recover(home, step, base_env())


@pytest.mark.systemd
@pytest.mark.parametrize("step", ["prepared", "spawned"])
def test_a_killed_oneshot_tick_leaves_scoped_workers_consistent(
    home: Path, step: str, systemd_manager: SystemdManager
) -> None:
    # INVOCATION_ID: the tick behaves as in a Type=oneshot unit, so workers must get scopes.
    env = {**systemd_manager.env, "INVOCATION_ID": "0123456789abcdef"}
    placements, said = crash_and_recover(home, step, env)
    assert placements == {"scoped"}, said
