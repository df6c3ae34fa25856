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
    text = "[Service]\nType=oneshot\nExecStart=/usr/bin/dispatch kanban tick\n"
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


def test_system_unit_needs_the_users_runtime_dir(tmp_path: Path, linger_dir: Path) -> None:
    (linger_dir / "root").touch()
    base = "[Service]\nType=notify\nUser=root\nExecStart=/usr/bin/dispatch serve\n"
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
    assert set(found["checks"]) == {"kill_mode", "type", "linger", "runtime_dir"}
    assert proc.returncode == (0 if report["probe"]["ok"] else 1)
