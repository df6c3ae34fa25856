"""Bus discovery (scope.bus.discover): derived env, runtime dir and socket safety checks."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from scope.abc import ManagerKind
from scope.bus import BUS_ENV, RUNTIME_ENV, discover, socket_reachable

UID = os.geteuid()
OTHER_UID = 65534 if UID != 65534 else 65533


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Path]:
    """A valid runtime dir (0700, ours) holding a listening bus socket."""
    path = tmp_path / "rt"
    path.mkdir(mode=0o700)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path / "bus"))
    sock.listen(1)
    yield path
    sock.close()


def empty_root(tmp_path: Path) -> str:
    root = tmp_path / "user"
    root.mkdir(exist_ok=True)
    return str(root)


def test_valid_runtime_dir_and_bus(runtime: Path, tmp_path: Path):
    environ = {RUNTIME_ENV: str(runtime), "KEEP": "1"}
    info = discover(environ, uid=UID, user_runtime_root=empty_root(tmp_path))
    assert info.manager is ManagerKind.USER
    assert info.runtime_dir == str(runtime) and info.bus_ok and info.detail == ""
    assert info.env[BUS_ENV] == f"unix:path={runtime}/bus"
    assert info.env["KEEP"] == "1"
    assert info.private_socket == f"{runtime}/systemd/private"
    assert environ == {RUNTIME_ENV: str(runtime), "KEEP": "1"}  # never mutated


def test_untrusted_preset_bus_address_is_replaced(runtime: Path, tmp_path: Path):
    environ = {RUNTIME_ENV: str(runtime), BUS_ENV: "unix:path=/somewhere/else"}
    info = discover(environ, uid=UID, user_runtime_root=empty_root(tmp_path))
    assert info.env[BUS_ENV] == f"unix:path={runtime}/bus"


def test_preset_bus_address_removed_when_no_trusted_socket(runtime: Path, tmp_path: Path):
    (runtime / "bus").unlink()
    environ = {RUNTIME_ENV: str(runtime), BUS_ENV: "unix:path=/somewhere/else"}
    info = discover(environ, uid=UID, user_runtime_root=empty_root(tmp_path))
    assert not info.bus_ok and BUS_ENV not in info.env
    assert info.runtime_dir == str(runtime)
    assert "no bus socket" in info.detail


def test_world_writable_runtime_dir_rejected(runtime: Path, tmp_path: Path):
    runtime.chmod(0o777)
    info = discover({RUNTIME_ENV: str(runtime)}, uid=UID, user_runtime_root=empty_root(tmp_path))
    assert info.runtime_dir is None and not info.bus_ok
    assert "world-writable" in info.detail
    assert RUNTIME_ENV not in info.env and BUS_ENV not in info.env


def test_group_writable_runtime_dir_rejected(runtime: Path, tmp_path: Path):
    runtime.chmod(0o770)
    info = discover({RUNTIME_ENV: str(runtime)}, uid=UID, user_runtime_root=empty_root(tmp_path))
    assert info.runtime_dir is None


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_foreign_owned_runtime_dir_rejected(runtime: Path, tmp_path: Path):
    os.chown(runtime, OTHER_UID, -1)
    info = discover({RUNTIME_ENV: str(runtime)}, uid=UID, user_runtime_root=empty_root(tmp_path))
    assert info.runtime_dir is None
    assert f"owned by uid {OTHER_UID}" in info.detail


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_foreign_owned_bus_socket_rejected(runtime: Path, tmp_path: Path):
    os.chown(runtime / "bus", OTHER_UID, -1, follow_symlinks=False)
    info = discover({RUNTIME_ENV: str(runtime)}, uid=UID, user_runtime_root=empty_root(tmp_path))
    assert info.runtime_dir == str(runtime) and not info.bus_ok
    assert BUS_ENV not in info.env


def test_symlinked_runtime_dir_rejected(runtime: Path, tmp_path: Path):
    link = tmp_path / "link"
    link.symlink_to(runtime)
    info = discover({RUNTIME_ENV: str(link)}, uid=UID, user_runtime_root=empty_root(tmp_path))
    assert info.runtime_dir is None and "symlink" in info.detail


def test_relative_runtime_dir_rejected(tmp_path: Path):
    info = discover({RUNTIME_ENV: "run/user"}, uid=UID, user_runtime_root=empty_root(tmp_path))
    assert info.runtime_dir is None and "not an absolute path" in info.detail


def test_bus_path_that_is_not_a_socket(runtime: Path, tmp_path: Path):
    (runtime / "bus").unlink()
    (runtime / "bus").write_text("")
    info = discover({RUNTIME_ENV: str(runtime)}, uid=UID, user_runtime_root=empty_root(tmp_path))
    assert not info.bus_ok and "not a socket" in info.detail


def test_falls_back_to_run_user_uid(runtime: Path, tmp_path: Path):
    root = tmp_path / "user"
    root.mkdir()
    runtime.rename(root / str(UID))
    fallback = root / str(UID)
    info = discover({RUNTIME_ENV: "/nonexistent/dir"}, uid=UID, user_runtime_root=str(root))
    assert info.runtime_dir == str(fallback) and info.bus_ok
    assert info.env[RUNTIME_ENV] == str(fallback)
    info = discover({}, uid=UID, user_runtime_root=str(root))
    assert info.runtime_dir == str(fallback)


def test_derived_fresh_per_call(runtime: Path, tmp_path: Path):
    environ = {RUNTIME_ENV: str(runtime)}
    root = empty_root(tmp_path)
    assert discover(environ, uid=UID, user_runtime_root=root).bus_ok
    (runtime / "bus").rename(runtime / "bus.away")
    assert not discover(environ, uid=UID, user_runtime_root=root).bus_ok
    (runtime / "bus.away").rename(runtime / "bus")
    assert discover(environ, uid=UID, user_runtime_root=root).bus_ok


def test_system_manager(tmp_path: Path):
    info = discover({BUS_ENV: "unix:path=/x"}, ManagerKind.SYSTEM, uid=UID)
    assert info.manager is ManagerKind.SYSTEM and BUS_ENV not in info.env
    assert info.private_socket == "/run/systemd/private"


def test_socket_reachable(runtime: Path):
    assert socket_reachable(str(runtime / "bus"))
    assert not socket_reachable(str(runtime / "nothing"))
    assert not socket_reachable(None)
