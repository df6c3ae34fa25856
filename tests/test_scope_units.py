"""Unit names, caller facts and error translation (pure or /proc-fixture based)."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from scope.errors import BusError, ScopeError
from scope.facts import caller_unit
from scope.translate import (
    ScopeStartFailed,
    ScopeTimeout,
    from_dbus_reply,
    from_process,
    is_not_loaded,
    translate,
)
from scope.unitname import MAX_UNIT_NAME, is_ours, sanitise, scope_name

VALID = re.compile(r"^[A-Za-z0-9:_.\\-]+\.scope$")


def test_scope_name_carries_caller_and_ids():
    name = scope_name("kanban", ["c1", "run", "r7"], unique="abc")
    assert name == "dispatch-kanban-c1-run-r7-abc.scope"
    assert is_ours(name)


def test_scope_names_are_unique():
    names = {scope_name("cron", ["job"]) for _ in range(200)}
    assert len(names) == 200


@pytest.mark.parametrize(
    "part", ["a b", "ü/é", "../..", "x@y", "semi;colon", "$(rm -rf)", "", "\n\t", ".hidden."]
)
def test_scope_name_sanitised(part: str):
    name = scope_name("cli", [part, "ok"])
    assert VALID.match(name), name
    assert ".." not in name and "/" not in name and "@" not in name


def test_scope_name_length_bounded():
    name = scope_name("kanban", ["x" * 300, "y" * 300])
    assert len(name) <= MAX_UNIT_NAME and name.endswith(".scope")
    assert name.startswith("dispatch-kanban-")


def test_sanitise_never_empty():
    assert sanitise("") == "_" and sanitise("...") == "_"


def fake_proc(tmp_path: Path, cgroup_text: str) -> str:
    (tmp_path / "self").mkdir(parents=True)
    (tmp_path / "self" / "cgroup").write_text(cgroup_text)
    return str(tmp_path)


@pytest.mark.parametrize(
    ("cgroup", "environ", "in_unit", "unit"),
    [
        ("0::/system.slice/gw.service\n", {}, True, "gw.service"),
        (
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/gw.service\n",
            {},
            True,
            "gw.service",
        ),
        ("0::/system.slice/gw.service/worker\n", {}, True, "gw.service"),
        ("0::/init.scope\n", {}, False, None),
        ("0::/\n", {}, False, None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", {}, False, None),
        ("0::/app.slice/dispatch-cli-1.scope\n", {}, False, None),
        ("0::/init.scope\n", {"INVOCATION_ID": "abc"}, True, None),
        ("0::/\n", {"INVOCATION_ID": ""}, False, None),
        (
            "12:pids:/x\n1:name=systemd:/a.service\n0::/system.slice/b.service\n",
            {},
            True,
            "b.service",
        ),
    ],
)
def test_caller_unit(tmp_path: Path, cgroup: str, environ: dict, in_unit: bool, unit: str | None):
    where = caller_unit(environ, proc_root=fake_proc(tmp_path, cgroup))
    assert where.in_teardown_unit is in_unit
    assert where.unit == unit


def test_caller_unit_without_proc(tmp_path: Path):
    where = caller_unit({}, proc_root=str(tmp_path))
    assert where.in_teardown_unit is False and where.cgroup is None


def test_translate_maps_foreign_errors():
    err = translate(
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused", "/r/bus"),
        backend="dbus",
        unit="u.scope",
        op="connect",
    )
    assert isinstance(err, BusError) and "/r/bus" in err.message
    assert isinstance(translate(TimeoutError(), backend="dbus", unit=None, op="x"), ScopeTimeout)

    class DBusError(Exception):  # shaped like dbus_next.errors.DBusError
        def __init__(self, type_: str, text: str) -> None:
            super().__init__(text)
            self.type, self.text = type_, text

    err = translate(
        DBusError("org.freedesktop.systemd1.UnitExists", "exists"),
        backend="dbus",
        unit="u.scope",
        op="StartTransientUnit",
    )
    assert isinstance(err, ScopeStartFailed) and err.error_name.endswith("UnitExists")
    err = translate(
        DBusError("org.freedesktop.DBus.Error.ServiceUnknown", "gone"),
        backend="dbus",
        unit=None,
        op="x",
    )
    assert isinstance(err, BusError)
    ours = ScopeError("x")
    assert translate(ours, backend="dbus", unit=None, op="x") is ours
    assert isinstance(
        translate(RuntimeError("boom"), backend="dbus", unit=None, op="x"), ScopeStartFailed
    )


def test_from_process_and_not_loaded():
    err = from_process(
        "systemd-run",
        1,
        "Failed to connect to bus: No such file or directory\n",
        backend="systemd-run",
        unit="u.scope",
    )
    assert isinstance(err, BusError) and "exited 1" in err.message
    err = from_process(
        "systemd-run", 1, "Unit u.scope already exists.", backend="systemd-run", unit="u.scope"
    )
    assert isinstance(err, ScopeStartFailed) and "\n" not in err.message
    assert is_not_loaded("Failed to kill unit x.scope: Unit x.scope not loaded.")
    assert is_not_loaded(
        from_dbus_reply("org.freedesktop.systemd1.NoSuchUnit", "no", unit="x", op="GetUnit")
    )
