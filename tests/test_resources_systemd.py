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
from scope.latency import read_placement_latency
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
    latency = report["resources"]["placement_latency"]
    assert latency == read_placement_latency().to_json()  # this host, as it is mounted

    assert main(base, env) == 1
    text = capsys.readouterr().out
    assert f"latency:   {latency['detail']}" in text
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


DISPLAY_CONFIG = """\
kanban:
  assignees:
    w:
      command: [python3, -I, -c, "b = bytearray(24 << 20); print('ok')"]
      resources: {memory_max: 256MiB, runtime_max: 10m}
cron:
  jobs:
    - id: small
      schedule: "0 3 * * *"
      command: [python3, -I, -c, "b = bytearray(24 << 20); print('ok')"]
      resources: {memory_max: 128MiB}
"""


def test_show_history_and_the_web_give_each_runs_class_peak_and_cpu(
    systemd_manager: SystemdManager, tmp_path: Path, capsys
) -> None:
    from starlette.testclient import TestClient

    from dispatcher.web.app import create_app, create_site
    from dispatcher.web.guard import Access, cookie_name
    from dispatcher.web.keys import Keys, load_secret
    from dispatcher.web.server import allowed_hosts, parse_listen
    from dispatcher.web.source import Source

    config = tmp_path / "config.yaml"
    config.write_text(DISPLAY_CONFIG)
    state = tmp_path / "state"
    env = {**systemd_manager.env, "HOME": str(tmp_path)}
    env.pop("INVOCATION_ID", None)
    base = ["--config", str(config), "--state-dir", str(state)]

    def cli(*argv: str) -> str:
        capsys.readouterr()
        code = main([*base, *argv], env)
        out, err = capsys.readouterr()
        assert code == 0, err
        return out

    card_id = cli("kanban", "add", "hog", "--assignee", "w").strip()
    cli("kanban", "tick")
    board = Workspace(load_config(config).settings, state, environ=env, config_path=config)
    try:

        def done() -> bool:
            board.refresh()
            return board.store.get_card(card_id).status is CardStatus.DONE

        systemd_manager.wait_for(done, timeout=30, interval=0.1, what="the card done")
    finally:
        board.close()
    cli("cron", "run", "small", "--wait")

    (run,) = json.loads(cli("kanban", "show", card_id, "--json"))["runs"]
    assert run["placement"] == "scoped"
    assert run["resources"] == {
        "class": "memory_max 256MiB, runtime_max 600s",
        "limits": {"memory_max": 256 << 20, "runtime_max": 600.0},
        "not_enforced": [],
    }
    # The worker touched 24 MiB: its scope's peak is at least that; CPU time was measured.
    assert run["memory_peak"] >= 24 << 20 and run["cpu_time"] >= 0
    shown = cli("kanban", "show", card_id)
    assert "      class memory_max 256MiB, runtime_max 600s; peak " in shown
    assert ", cpu " in shown

    (fire,) = json.loads(cli("cron", "history", "--json"))
    assert fire["resources"]["class"] == "memory_max 128MiB"
    assert fire["memory_peak"] >= 24 << 20 and fire["cpu_time"] is not None
    history = cli("cron", "history")
    assert "CLASS" in history and "memory_max 128MiB" in history and "peak " in history

    settings = load_config(config).settings
    source = Source(settings, state, env, config_path=config)
    listen = parse_listen("127.0.0.1:8470")
    access = Access(
        keys=Keys(load_secret(state)),
        hosts=allowed_hosts(listen, 8470),
        pages_need_secret=False,
        cookie=cookie_name(8470),
        origin="http://127.0.0.1:8470",
    )
    client = TestClient(create_app(create_site(source, access)), base_url="http://127.0.0.1:8470")
    try:
        page = client.get(f"/cards/{card_id}").text
        assert "<th>class</th><th>used</th>" in page
        assert "<td>memory_max 256MiB, runtime_max 600s</td>" in page and "peak " in page
        cron_page = client.get("/cron/small").text
        assert "<td>memory_max 128MiB</td>" in cron_page
        session_page = client.get(f"/sessions/{run['session_id']}").text
        assert "<dt>class</dt><dd>memory_max 256MiB, runtime_max 600s</dd>" in session_page
        assert "<dt>used</dt><dd>peak " in session_page
    finally:
        client.close()
        source.close()
