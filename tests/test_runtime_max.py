"""A scope stopped at its runtime_max (``RuntimeMaxSec=``) ends ``timed_out``: the keeper asks
the manager for its unit's ``Result`` while it still lives in the scope; a stop by an operator
or by dispatch never reads as a timeout."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from dispatcher.app.workspace import Workspace
from dispatcher.config import load_config
from dispatcher.kanban.model import CardStatus, EventKind
from dispatcher.launch.outcome import Outcome, outcome_of
from registry.abc import SessionState
from registry.keeper.files import ExitRecord
from registry.keeper.program import unit_result
from scope import open_scoper
from scope.abc import BackendKind, Placement, Policy
from scope.foundation.clock import FakeClock
from scope.resources import ScopeProperties
from scope.settings import ScopeSettings
from tests.support.systemd import SystemdManager
from tests.support.wait import wait_for
from tests.test_cron_process import T0, Rig
from tests.test_registry_support import open_registry, request

SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


# -- the keeper's question, over a stand-in systemctl ---------------------------------------


def _tool(tmp_path: Path, body: str) -> bytes:
    path = tmp_path / "systemctl"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(stat.S_IRWXU)
    return os.fsencode(path)


def _environ(tool: bytes, manager: bytes = b"user") -> dict[bytes, bytes]:
    return {
        b"DISPATCH_SCOPE_UNIT": b"dispatch-kanban-x.scope",
        b"DISPATCH_SCOPE_SYSTEMCTL": tool,
        b"DISPATCH_SCOPE_MANAGER": manager,
        b"XDG_RUNTIME_DIR": b"/run/user/1000",
    }


def test_the_keeper_asks_for_its_units_result(tmp_path: Path) -> None:
    args = tmp_path / "args"
    tool = _tool(tmp_path, f'echo "$@ $XDG_RUNTIME_DIR" > {args}\necho timeout')
    assert unit_result(_environ(tool)) == "timeout"
    assert args.read_text().split() == [
        "--user",
        "show",
        "--property=Result",
        "--value",
        "dispatch-kanban-x.scope",
        "/run/user/1000",
    ]
    assert unit_result(_environ(tool, b"system")) == "timeout"
    assert args.read_text().split()[0] == "show"


def test_the_question_outlives_the_stop_signal(tmp_path: Path) -> None:
    # The manager's stop signals every pid it finds in the scope, the keeper's question too.
    tool = _tool(tmp_path, "kill -TERM $$; echo timeout")
    assert unit_result(_environ(tool)) == "timeout"


@pytest.mark.parametrize(
    "body",
    ["echo timeout; exit 1", "echo 'not a result!'", "exit 0", "sleep 5; echo timeout"],
    ids=["failed", "junk", "silent", "slow"],
)
def test_no_answer_is_no_result(tmp_path: Path, body: str) -> None:
    assert unit_result(_environ(_tool(tmp_path, body)), bound=0.3) is None


def test_without_the_scope_layers_variables_nothing_is_asked(tmp_path: Path) -> None:
    args = tmp_path / "args"
    tool = _tool(tmp_path, f"touch {args}; echo timeout")
    assert unit_result({b"DISPATCH_SCOPE_SYSTEMCTL": tool}) is None
    assert unit_result({b"DISPATCH_SCOPE_UNIT": b"x.scope"}) is None
    assert not args.exists()


def test_the_record_carries_the_result_and_old_records_load() -> None:
    base = {"state": "exited", "signal": "SIGTERM", "reason": "killed by SIGTERM"}
    record = ExitRecord.from_json({**base, "unit_result": "timeout"})
    assert record.unit_result == "timeout"
    assert ExitRecord.from_json(record.to_json()).unit_result == "timeout"
    assert ExitRecord.from_json(base).unit_result is None
    assert ExitRecord.from_json({**base, "unit_result": 7}).unit_result is None


# -- real scopes, both backends -----------------------------------------------------------------


@pytest.mark.systemd
@pytest.mark.parametrize("backend", [BackendKind.DBUS, BackendKind.SYSTEMD_RUN])
def test_runtime_max_is_a_timeout_and_other_stops_are_not(
    tmp_path: Path, systemd_manager: SystemdManager, leak_guard, backend: BackendKind
) -> None:
    env = dict(systemd_manager.env)
    env.pop("INVOCATION_ID", None)
    scoper = open_scoper(ScopeSettings(backend=backend), Policy(), environ=env)
    argv = [sys.executable, "-I", "-c", SLEEPER]
    try:
        with open_registry(tmp_path / "state", scoper) as registry:
            short = registry.spawn(request(argv, resources=ScopeProperties(runtime_max=1)))
            # Stopped by an operator and by dispatch, each with a runtime_max set too.
            long = ScopeProperties(runtime_max=60)
            by_operator = registry.spawn(request(argv, resources=long))
            by_dispatch = registry.spawn(request(argv, resources=long))
            for started in (short, by_operator, by_dispatch):
                assert started.placement is Placement.SCOPED and started.unit
                wait_for(lambda s=started: b"ready" in registry.read_log(s.id), 10, what="ready")
            systemd_manager.systemctl("stop", by_operator.unit or "")
            killed = registry.kill(by_dispatch.id, grace=1.0).session
            timed = registry.wait(short.id, timeout=20).snapshot.session
            stopped = registry.wait(by_operator.id, timeout=20).snapshot.session
    finally:
        scoper.close()
    assert timed.state is SessionState.TIMED_OUT and timed.signal == "SIGTERM"
    result = outcome_of(timed)
    assert result.outcome is Outcome.TIMED_OUT
    assert result.error == "stopped by systemd at runtime_max 1s; killed by SIGTERM"
    assert stopped.state is SessionState.EXITED and stopped.signal == "SIGTERM"
    assert outcome_of(stopped).outcome is Outcome.FAILED
    assert killed.state is SessionState.KILLED
    assert outcome_of(killed).outcome is Outcome.FAILED


STUBBORN = (
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\ntime.sleep(60)\n"
)


@pytest.mark.systemd
def test_a_worker_ignoring_the_stop_is_killed_after_the_grace_and_reads_timed_out(
    tmp_path: Path, systemd_manager: SystemdManager, leak_guard
) -> None:
    # The manager's stop would wait 90 s (TimeoutStopSec=), then SIGKILL the keeper too, which
    # could then write no record (lost): the keeper ends the worker itself after kill_grace.
    env = dict(systemd_manager.env)
    env.pop("INVOCATION_ID", None)
    scoper = open_scoper(ScopeSettings(backend=BackendKind.DBUS), Policy(), environ=env)
    argv = [sys.executable, "-I", "-c", STUBBORN]
    try:
        with open_registry(tmp_path / "state", scoper, kill_grace=0.5) as registry:
            started = registry.spawn(request(argv, resources=ScopeProperties(runtime_max=1)))
            assert started.placement is Placement.SCOPED
            wait_for(lambda: b"ready" in registry.read_log(started.id), 10, what="ready")
            ended = registry.wait(started.id, timeout=20).snapshot.session
    finally:
        scoper.close()
    assert ended.state is SessionState.TIMED_OUT and ended.signal == "SIGKILL", ended
    assert outcome_of(ended).error == "stopped by systemd at runtime_max 1s; killed by SIGKILL"


# -- kanban and cron report it, and a rule on timed_out applies ---------------------------------

# Under a runtime_max of 1 s, a worker that would sleep a minute; the rule stops at once.
WORKER = f"[{sys.executable}, -I, -c, {json.dumps(SLEEPER)}]"
RETRY = (
    "{attempts: 3, backoff: {initial: 0s, max: 0s, jitter: none},"
    " rules: [{outcomes: [timed_out], action: fail}]}"
)


@pytest.mark.systemd
def test_kanban_and_cron_report_timed_out_and_a_rule_on_it_applies(
    tmp_path: Path, systemd_manager: SystemdManager, leak_guard
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "kanban:\n  assignees:\n    slow:\n"
        f"      command: {WORKER}\n"
        "      resources: {runtime_max: 1s}\n"
        f"      retry: {RETRY}\n"
        "cron:\n  jobs:\n    - id: slow\n      schedule: '*/5 * * * *'\n"
        f"      command: {WORKER}\n"
        "      resources: {runtime_max: 1s}\n"
        f"      retry: {RETRY}\n"
    )
    settings = load_config(config).settings
    env = {**systemd_manager.env, "HOME": str(tmp_path)}
    env.pop("INVOCATION_ID", None)
    board = Workspace(settings, tmp_path / "board", environ=env, config_path=config)
    # A scheduler inside a unit (the gateway under systemd) gives its workers scopes.
    cron_env = {**env, "INVOCATION_ID": "0123456789abcdef"}
    rig = Rig(tmp_path, *settings.cron.jobs, environ=cron_env, clock=FakeClock(T0))
    try:
        card_id = board.board.add("slow", assignee="slow", now=board.now())[0].id
        assert len(board.tick().dispatched) == 1
        rig.scheduler.tick()
        rig.scheduler.tick(rig.at("2026-01-05T10:00:00"))

        def ended() -> bool:
            board.refresh()
            rig.scheduler.tick()
            runs = board.store.runs_of(card_id)
            return runs[-1].outcome is not None and rig.outcomes() == ["timed_out"]

        systemd_manager.wait_for(ended, timeout=30, what="both workers stopped at runtime_max")
        (run,) = board.store.runs_of(card_id)
        assert run.outcome is Outcome.TIMED_OUT
        assert run.error == "stopped by systemd at runtime_max 1s; killed by SIGTERM"
        card = board.store.get_card(card_id)
        assert card.status is CardStatus.BLOCKED
        gave_up = [e for e in board.store.events_of(card_id) if e.kind == EventKind.GAVE_UP]
        assert [e.data["reason"] for e in gave_up] == ["rule timed_out: no retry"]
        (fire,) = rig.rows()
        assert fire.placement == "scoped" and fire.error == run.error
        assert len(fire.tries) == 1 and fire.attempt == 1, [
            (t.outcome, t.signal, t.error, rig.runtime.registry.get(t.session_id or "").state)
            for t in fire.tries
        ]
    finally:
        rig.close()
        board.close()
