"""The systemd tier's fixture itself: scopes, the restart drill, and an unreachable manager."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from dbus_next import Message, MessageType
from dbus_next.aio import MessageBus

from scope.cgroup import leaf_unit
from tests.support.leaks import LeakGuard
from tests.support.procs import ProcessIdentity, identify, is_alive
from tests.support.systemd import CommandFailed, SystemdManager

pytestmark = [pytest.mark.systemd, pytest.mark.timeout(60)]


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


async def _manager_version_over_bus(address: str) -> str:
    """Read systemd's Version property over the session bus with dbus-next, as scope/ will."""
    bus = await MessageBus(bus_address=address).connect()
    try:
        reply = await bus.call(
            Message(
                destination="org.freedesktop.systemd1",
                path="/org/freedesktop/systemd1",
                interface="org.freedesktop.DBus.Properties",
                member="Get",
                signature="ss",
                body=["org.freedesktop.systemd1.Manager", "Version"],
            )
        )
        assert reply is not None and reply.message_type == MessageType.METHOD_RETURN, reply
        return str(reply.body[0].value)
    finally:
        bus.disconnect()


def manager_version_over_bus(address: str, timeout: float = 5.0) -> str:
    """Blocking wrapper with a bound, so a hung bus fails the test instead of stalling it."""
    return asyncio.run(asyncio.wait_for(_manager_version_over_bus(address), timeout))


def test_systemd_run_scope_places_command_in_a_scope(systemd_manager: SystemdManager) -> None:
    done = systemd_manager.systemd_run(
        "--scope", "--quiet", "--", "sh", "-c", "cat /proc/self/cgroup"
    )
    (v2_line,) = (line for line in done.stdout.splitlines() if line.startswith("0::"))
    unit = leaf_unit(v2_line[3:])
    assert unit is not None and unit.endswith(".scope"), v2_line


def test_stop_kills_unscoped_child_and_spares_scoped_one(
    leak_guard: LeakGuard, systemd_manager: SystemdManager
) -> None:
    """The restart drill: stopping a service kills its own children, not those it scoped."""
    manager = systemd_manager
    scope = manager.unique_name("dsd-keep", ".scope")
    # Both sleeps run in the background under one sh that stays the main process: had sh exec'd
    # systemd-run, the service's main pid would itself move into the scope.
    service = manager.run_transient_service(
        [
            "sh",
            "-c",
            f"sleep 300 & systemd-run --user --scope --quiet --unit {scope} -- sleep 300 & wait",
        ]
    )
    try:
        (scoped_pid,) = manager.wait_for(lambda: manager.unit_pids(scope), what=f"{scope} pids")
        main_pid = int(manager.unit_property(service, "MainPID"))
        (unscoped_pid,) = manager.wait_for(
            lambda: [p for p in manager.unit_pids(service) if p != main_pid],
            what=f"the direct sleep in {service}",
        )
        unscoped, scoped = identify(unscoped_pid), identify(scoped_pid)
        # sh runs "sleep"; systemd-run resolves it to an absolute path before exec.
        assert _cmdline(unscoped.pid) == ["sleep", "300"]
        assert Path(_cmdline(scoped.pid)[0]).name == "sleep"

        manager.stop_service(service)

        manager.wait_for(lambda: not is_alive(unscoped), what="the unscoped sleep to die")
        assert is_alive(scoped), "the scoped sleep died with the service"
        assert manager.unit_pids(scope) == [scoped.pid]
        assert manager.unit_property(scope, "ActiveState") == "active"
    finally:
        _stop_quietly(manager, service)
        _stop_quietly(manager, scope)
    manager.wait_for(lambda: not is_alive(scoped), what="the scoped sleep to stop with its scope")
    assert manager.unit_pids(scope) == []


def _stop_quietly(manager: SystemdManager, unit: str) -> None:
    """Cleanup that must not mask the test's own failure; a unit already gone is fine."""
    manager.systemctl("stop", unit, check=False)


def test_manager_unreachable_hides_bus_and_private_socket(systemd_manager: SystemdManager) -> None:
    manager = systemd_manager
    assert manager_version_over_bus(manager.bus_address) == manager.version

    with manager.manager_unreachable():
        assert not manager.bus_socket.exists()
        assert not manager.private_socket.exists()
        placed = manager.systemd_run("--scope", "--quiet", "--", "true", check=False)
        assert placed.returncode != 0, placed
        assert "Failed to connect to bus" in placed.stderr, placed.stderr
        with pytest.raises(OSError):
            manager_version_over_bus(manager.bus_address)

    assert manager.bus_socket.is_socket() and manager.private_socket.is_socket()
    manager.systemd_run("--scope", "--quiet", "--", "true")
    assert manager_version_over_bus(manager.bus_address) == manager.version


def test_manager_unreachable_restores_on_exception(systemd_manager: SystemdManager) -> None:
    manager = systemd_manager
    with pytest.raises(RuntimeError, match="boom"), manager.manager_unreachable():
        raise RuntimeError("boom")
    assert manager.bus_socket.is_socket() and manager.private_socket.is_socket()
    manager.systemctl("show", "--property=Version")


def test_transient_service_types_env_and_cwd(
    systemd_manager: SystemdManager, tmp_path: Path
) -> None:
    """run_transient_service passes env and cwd; oneshot returns after the process finished."""
    out = tmp_path / "out"
    manager = systemd_manager
    manager.run_transient_service(
        ["sh", "-c", 'printf "%s %s" "$GREETING" "$PWD" > out'],
        env={"GREETING": "hello there"},
        type="oneshot",
        cwd=tmp_path,
    )
    assert out.read_text() == f"hello there {tmp_path}"

    unit = manager.run_transient_service(["sleep", "300"], type="exec")
    (pid,) = manager.unit_pids(unit)
    sleeper: ProcessIdentity = identify(pid)
    manager.restart_service(unit)
    manager.wait_for(lambda: not is_alive(sleeper), what="the pre-restart sleep to end")
    (new_pid,) = manager.wait_for(lambda: manager.unit_pids(unit), what="the restarted sleep")
    assert new_pid != sleeper.pid
    manager.stop_service(unit)
    assert manager.unit_pids(unit) == []


def test_transient_service_wait_reports_the_result(systemd_manager: SystemdManager) -> None:
    manager = systemd_manager
    unit = manager.run_transient_service(["true"], wait=True)
    assert manager.unit_property(unit, "LoadState") == "not-found"  # finished and collected
    with pytest.raises(CommandFailed) as failed:
        manager.run_transient_service(["sh", "-c", "exit 3"], wait=True)
    assert failed.value.returncode == 3
