"""Resource classes against the real (private) systemd user manager: what doctor reports about
its controllers, and a class that cannot take effect refused (or started, with best_effort)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from dispatcher.app.workspace import Workspace
from dispatcher.cli.main import main
from dispatcher.config import load_config
from dispatcher.kanban.model import CardStatus
from dispatcher.launch.outcome import Outcome
from scope import open_scoper, policy_from
from scope.cgroup import parse_mountinfo
from scope.hierarchy import ineffective
from scope.resources import ScopeProperties
from scope.settings import ScopeSettings
from scope.systemd import SystemdScoper
from tests.support.systemd import SystemdManager

pytestmark = pytest.mark.systemd

# Keys in the order the test prefers them as "one that cannot take effect under this manager".
CANDIDATES = {
    "memory_high": "16MiB",
    "cpu_weight": 50,
    "tasks_max": 64,
    "io_weight": 50,
    "memory_swap_max": 0,
}


def host_layout() -> str:
    """The layout read independently of the code under test: systemd's own rule."""
    entries = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    tracking = any(
        e.fstype == "cgroup" and "name=systemd" in e.super_options.split(",") for e in entries
    )
    has_v2 = any(e.fstype == "cgroup2" for e in entries)
    if tracking:
        return "hybrid" if has_v2 else "v1"
    return "v2" if has_v2 else "none"


def scoper_for(manager: SystemdManager) -> SystemdScoper:
    env = dict(manager.env)
    env.pop("INVOCATION_ID", None)
    scoper = open_scoper(ScopeSettings(), policy_from(False, False), environ=env)
    assert isinstance(scoper, SystemdScoper)
    return scoper


def unapplicable(manager: SystemdManager) -> str:
    """A class key this manager's scopes would not enforce (skip when every key applies)."""
    scoper = scoper_for(manager)
    try:
        controllers = scoper.controllers()
    finally:
        scoper.close()
    for key, value in CANDIDATES.items():
        props = ScopeProperties(**{key: 1 if key != "memory_swap_max" else 0})
        if ineffective(props, controllers):
            return f"{key}: {json.dumps(value)}"
    pytest.skip("every class key takes effect under this manager")


def write_config(home: Path, class_text: str) -> Path:
    config = home / "config.yaml"
    config.write_text(
        "kanban:\n"
        "  infrastructure_cooldown: 1s\n"
        "  assignees:\n"
        "    w:\n"
        "      command: [sh, -c, 'echo done']\n"
        f"      resources: {{memory_max: 256MiB, {class_text}}}\n"
    )
    return config


def test_doctor_names_the_layout_the_controllers_and_a_refused_class(
    systemd_manager: SystemdManager, tmp_path: Path, capsys
) -> None:
    key_text = unapplicable(systemd_manager)
    config = write_config(tmp_path, key_text)
    env = {**systemd_manager.env, "HOME": str(tmp_path)}
    env.pop("INVOCATION_ID", None)
    base = ["--config", str(config), "--state-dir", str(tmp_path / "state"), "doctor"]
    status = main([*base, "--json"], env)
    report = json.loads(capsys.readouterr().out)
    resources = report["resources"]
    assert resources["layout"] == host_layout()
    assert resources["manager_cgroup"] == systemd_manager.manager_property("ControlGroup")
    # The fixture grants its manager the memory controller (v1 here); runtime_max needs none.
    assert resources["controllers"]["memory"] is True
    assert resources["keys"]["memory_max"] is None and resources["keys"]["runtime_max"] is None
    if host_layout() == "hybrid":
        assert "cgroup v1 (hybrid here) has no MemoryHigh=" in resources["keys"]["memory_high"]
    (entry,) = resources["classes"]
    key = key_text.partition(":")[0]
    assert entry["name"] == "kanban.assignees.w.resources" and entry["refused"] is True
    assert list(entry["ineffective"]) == [key]
    assert any("its workers are refused (spawn_refused)" in p for p in report["problems"])
    assert status == 1 and report["probe"]["ok"] is True

    assert main(base, env) == 1
    text = capsys.readouterr().out
    assert f"cgroups:   {'hybrid' if host_layout() == 'hybrid' else ''}" in text
    assert "controllers for our scopes: memory yes" in text
    assert f"           no effect:   {key} (" in text
    assert "class:     FAIL  kanban.assignees.w.resources: " in text
    assert f"({key} would not take effect; its workers are refused)" in text
    assert "unhealthy: workers of kanban.assignees.w.resources are refused" in text


def test_a_class_that_cannot_take_effect_is_refused_and_best_effort_starts_it(
    systemd_manager: SystemdManager, tmp_path: Path, caplog
) -> None:
    key_text = unapplicable(systemd_manager)
    key = key_text.partition(":")[0]
    env = {**systemd_manager.env, "HOME": str(tmp_path)}
    env.pop("INVOCATION_ID", None)
    config = write_config(tmp_path, key_text)
    board = Workspace(
        load_config(config).settings, tmp_path / "state", environ=env, config_path=config
    )
    try:
        card = board.board.add("bounded", assignee="w", now=board.now())[0]
        report = board.tick()
        assert [c.infrastructure for c in report.refused] == [True]
        (run,) = board.store.runs_of(card.id)
        assert run.outcome is Outcome.SPAWN_REFUSED and run.infrastructure
        assert run.error and f"its resource class cannot take effect here: {key} (" in run.error
        assert "resources.best_effort: true" in run.error
        after = board.store.get_card(card.id)
        assert after.status is CardStatus.READY and after.consecutive_failures == 0
    finally:
        board.close()

    config = write_config(tmp_path, f"{key_text}, best_effort: true")
    board = Workspace(
        load_config(config).settings, tmp_path / "state", environ=env, config_path=config
    )
    try:
        with caplog.at_level(logging.WARNING, logger="dispatch.scope"):
            # Claimed once the 1 s infrastructure cooldown has passed.
            systemd_manager.wait_for(
                lambda: bool(board.tick().dispatched), timeout=15, interval=0.2, what="a claim"
            )
        warned = [r.getMessage() for r in caplog.records if "start without" in r.getMessage()]
        assert len(warned) == 1 and warned[0].startswith(f"oneshot workers start without {key}")

        def done() -> bool:
            board.refresh()
            return board.store.get_card(card.id).status is CardStatus.DONE

        systemd_manager.wait_for(done, timeout=20, interval=0.1, what="the best-effort worker")
        runs = board.store.runs_of(card.id)
        assert runs[-1].outcome is Outcome.COMPLETED and runs[-1].placement == "scoped"
    finally:
        board.close()
