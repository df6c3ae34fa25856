"""`dispatch doctor`'s unit checks: KillMode, Type, linger, runtime dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.gateway import units
from dispatcher.gateway.units import UnitFile, inspect_unit, parse_unit

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def linger_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    place = tmp_path / "linger"
    place.mkdir()
    monkeypatch.setattr(units, "LINGER_DIR", place)
    return place


def unit(tmp_path: Path, text: str, manager: str = "user") -> UnitFile:
    path = tmp_path / "dispatch-test.service"
    path.write_text(text)
    return UnitFile(path=path, manager=manager)


def test_parse_unit_accumulates_and_resets() -> None:
    parsed = parse_unit(
        "[Service]\nEnvironment=A=1\nEnvironment=B=2 \\\n  C=3\n# comment\nKillMode=process\n"
        "ExecStart=\nExecStart=/bin/dispatch serve\n"
    )
    assert parsed["Service"]["Environment"] == ["A=1", "B=2 C=3"]
    assert parsed["Service"]["ExecStart"] == ["/bin/dispatch serve"]


def test_degrading_oneshot_with_control_group_is_flagged(tmp_path: Path, linger_dir: Path) -> None:
    (linger_dir / "alice").touch()
    text = (
        f"[Service]\nType=oneshot\nExecStart={sys.executable} -m dispatcher.cli.main kanban tick\n"
    )
    report = inspect_unit(unit(tmp_path, text), degrade_without_scope=True, current_user="alice")
    assert report["role"] == "kanban-tick"
    assert report["checks"]["kill_mode"]["ok"] is False
    assert any("KillMode=process" in r for r in report["remedies"])
    # Without degrading, the workers have scopes and KillMode does not matter to them.
    fine = inspect_unit(unit(tmp_path, text), degrade_without_scope=False, current_user="alice")
    assert fine["ok"] is True


def test_serve_wants_type_notify_and_linger(tmp_path: Path) -> None:
    text = "[Service]\nType=simple\nExecStart=/usr/bin/dispatch serve\n"
    report = inspect_unit(unit(tmp_path, text), degrade_without_scope=False, current_user="bob")
    assert report["role"] == "serve"
    assert report["checks"]["type"]["ok"] is False
    assert report["checks"]["linger"]["ok"] is False
    assert "loginctl enable-linger bob" in " ".join(report["remedies"])


def test_a_restarting_serve_unit_must_stop_on_permanent_errors(tmp_path: Path) -> None:
    base = "[Service]\nType=notify\nExecStart=/usr/bin/dispatch serve\nRestart=on-failure\n"
    report = inspect_unit(unit(tmp_path, base), degrade_without_scope=False, current_user="bob")
    assert report["checks"]["restart"]["ok"] is False
    assert "dispatch-test.service: add RestartPreventExitStatus=1 2" in report["remedies"]
    only_two = base + "RestartPreventExitStatus=2\n"
    report = inspect_unit(unit(tmp_path, only_two), degrade_without_scope=False, current_user="b")
    assert report["checks"]["restart"]["ok"] is False
    both = base + "RestartPreventExitStatus=1 2\n"
    report = inspect_unit(unit(tmp_path, both), degrade_without_scope=False, current_user="b")
    assert report["checks"]["restart"]["ok"] is True
    never = "[Service]\nType=notify\nExecStart=/usr/bin/dispatch serve\n"
    report = inspect_unit(unit(tmp_path, never), degrade_without_scope=False, current_user="b")
    assert "restart" not in report["checks"]


def test_system_unit_needs_the_users_runtime_dir(tmp_path: Path, linger_dir: Path) -> None:
    (linger_dir / "root").touch()
    program = f"{sys.executable} -m dispatcher.cli.main"
    base = (
        f"[Service]\nType=notify\nUser=root\nExecStart={program} serve\n"
        f"ExecReload={program} reload --pid $MAINPID\n"
    )
    missing = inspect_unit(
        unit(tmp_path, base, "system"), degrade_without_scope=False, current_user="x"
    )
    assert missing["checks"]["runtime_dir"]["ok"] is False
    assert "XDG_RUNTIME_DIR=/run/user/0" in " ".join(missing["remedies"])
    exported = inspect_unit(
        unit(tmp_path, base + "Environment=XDG_RUNTIME_DIR=/run/user/0\n", "system"),
        degrade_without_scope=False,
        current_user="x",
    )
    assert exported["ok"] is True


def test_doctor_json_has_units(tmp_path: Path) -> None:
    env = dict(os.environ)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env.update(XDG_RUNTIME_DIR=str(runtime), HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path))
    env.pop("DBUS_SESSION_BUS_ADDRESS", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher.cli.main",
            "doctor",
            "--json",
            "--unit",
            str(ROOT / "contrib" / "dispatch-system.service"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    report = json.loads(proc.stdout)
    (found,) = report["units"]
    assert found["manager"] == "system" and found["role"] == "serve"
    assert set(found["checks"]) == {
        "kill_mode",
        "type",
        "exec_start",
        "exec_reload",
        "linger",
        "runtime_dir",
        "restart",
    }
    assert found["checks"]["restart"]["ok"] is True
    assert proc.returncode == (0 if report["probe"]["ok"] else 1)


def test_exec_start_must_exist_and_reload_should_wait(tmp_path: Path) -> None:
    text = "[Service]\nType=notify\nExecStart=%h/.local/bin/no-such-dispatch serve\n"
    text += "ExecReload=/bin/kill -HUP $MAINPID\n"
    report = inspect_unit(unit(tmp_path, text), degrade_without_scope=False, current_user="root")
    start = report["checks"]["exec_start"]
    assert start["ok"] is False and start["value"].endswith("/.local/bin/no-such-dispatch")
    assert not start["value"].startswith("%h")  # the specifier is expanded
    assert report["checks"]["exec_reload"]["ok"] is False
    remedies = " ".join(report["remedies"])
    assert "does not exist" in remedies and "reload --pid $MAINPID" in remedies
    fine = f"[Service]\nExecStart=-{sys.executable} -m dispatcher.cli.main kanban tick\n"
    tick = inspect_unit(unit(tmp_path, fine), degrade_without_scope=False, current_user="root")
    assert tick["checks"]["exec_start"]["ok"] is True and "exec_reload" not in tick["checks"]


@pytest.mark.parametrize(
    "name", ["dispatch.service", "dispatch-system.service", "dispatch@.service"]
)
def test_contrib_units_point_at_real_documentation_and_reload_with_a_verdict(name: str) -> None:
    sections = parse_unit((ROOT / "contrib" / name).read_text())
    docs = sections["Unit"]["Documentation"][-1].split()
    assert "man:dispatch(1)" in docs
    for url in docs:
        assert url.startswith(("man:", "file:")), url
        if url.startswith("file:"):
            # The installed docs path the quick start describes, or the checkout's.
            assert url.removeprefix("file:").endswith("/docs/systemd.md")
    service = sections["Service"]
    assert service["ExecReload"][-1].endswith("reload --pid $MAINPID")
    assert service["ExecStart"][-1].split()[0].endswith("/dispatch")
