"""Bus discovery: which runtime dir, bus socket and manager socket a spawn may trust.

Derived fresh for every spawn (so ``loginctl enable-linger`` run after start-up is picked up) and
returned as a new environment; ``os.environ`` is never read or written here, the caller hands in
the environment to start from. The checks are security checks: a runtime dir or socket that
someone else controls could be used to run our workers in *their* manager, so it is rejected:

* ``XDG_RUNTIME_DIR`` is used only when it is absolute, a real directory (not a symlink), owned
  by our uid and not group/other-writable; otherwise ``/run/user/<uid>`` under the same checks.
* ``DBUS_SESSION_BUS_ADDRESS`` becomes ``unix:path=<dir>/bus`` only when that path is a socket
  owned by us; a pre-set address is never trusted as such (it is replaced or removed).

The system manager (``scope.manager: system``, or ``auto`` as root without a user manager) uses
``/run/systemd/private`` and the system bus, both owned by root.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field

from scope.abc import MANAGER_ENV, SYSTEMCTL_ENV, UNIT_ENV, ManagerKind

__all__ = [
    "BUS_ENV",
    "RUNTIME_ENV",
    "SYSTEM_BUS",
    "SYSTEM_PRIVATE",
    "BusInfo",
    "check_runtime_dir",
    "discover",
    "manager_env",
    "socket_reachable",
]

RUNTIME_ENV = "XDG_RUNTIME_DIR"
BUS_ENV = "DBUS_SESSION_BUS_ADDRESS"
SYSTEM_BUS = "/run/dbus/system_bus_socket"
SYSTEM_PRIVATE = "/run/systemd/private"


@dataclass(frozen=True, kw_only=True)
class BusInfo:
    """The outcome of one discovery (see the module docstring)."""

    manager: ManagerKind
    """``user`` or ``system`` (never ``auto``: discovery resolves it)."""
    runtime_dir: str | None
    """The trusted runtime dir, or None when neither candidate passed the checks."""
    bus_path: str | None
    """The bus socket's path (also set when it failed the checks, for messages)."""
    bus_ok: bool
    """The bus socket exists, is a socket and is ours (it may still not answer)."""
    private_socket: str | None
    """The manager's private socket path (``<runtime dir>/systemd/private``)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The environment to hand to systemd-run and the D-Bus client (a new dict)."""
    detail: str = ""
    """What was wrong, empty when runtime dir and bus both passed."""

    @property
    def bus_address(self) -> str | None:
        """``unix:path=...`` of the trusted bus, else None."""
        return f"unix:path={self.bus_path}" if self.bus_ok and self.bus_path else None

    @property
    def usable(self) -> bool:
        """Some route to a manager may exist (trusted runtime dir, or the system manager)."""
        return self.manager is ManagerKind.SYSTEM or self.runtime_dir is not None


def check_runtime_dir(path: str, uid: int) -> str | None:
    """Why ``path`` is not a trustworthy runtime dir for ``uid``, or None when it is."""
    if not path:
        return "it is empty"
    if not os.path.isabs(path):
        return f"{path!r} is not an absolute path"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path} cannot be inspected ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    if info.st_uid != uid:
        return f"{path} is owned by uid {info.st_uid}, not {uid}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is group- or world-writable (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _check_socket(path: str, uid: int) -> str | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"no bus socket at {path}"
    except OSError as exc:
        return f"{path} cannot be inspected ({exc.strerror})"
    if not stat.S_ISSOCK(info.st_mode):
        return f"{path} is not a socket"
    if info.st_uid != uid:
        return f"{path} is owned by uid {info.st_uid}, not {uid}"
    return None


def socket_reachable(path: str | None, timeout: float = 1.0) -> bool:
    """Whether something accepts connections on the unix socket ``path`` right now."""
    if not path:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def discover(
    environ: Mapping[str, str],
    manager: ManagerKind = ManagerKind.AUTO,
    *,
    uid: int | None = None,
    user_runtime_root: str = "/run/user",
    system_private: str = SYSTEM_PRIVATE,
) -> BusInfo:
    """Derive the runtime dir, bus and manager socket to use, from ``environ`` (not mutated).

    ``uid`` defaults to the effective uid; ``user_runtime_root`` and ``system_private`` exist for
    tests. ``auto`` means the user manager, except that root falls back to the system manager
    when no user manager socket is found and the system one exists.
    """
    uid = os.geteuid() if uid is None else uid
    manager = ManagerKind(manager)
    if manager is ManagerKind.SYSTEM:
        return _system(environ, system_private)
    info = _user(environ, uid, user_runtime_root)
    if (
        manager is ManagerKind.AUTO
        and uid == 0
        and not (info.private_socket and os.path.exists(info.private_socket))
        and not info.bus_ok
        and os.path.exists(system_private)
    ):
        return _system(environ, system_private)
    return info


def _user(environ: Mapping[str, str], uid: int, root: str) -> BusInfo:
    env = dict(environ)
    problems: list[str] = []
    runtime: str | None = None
    candidates = []
    given = environ.get(RUNTIME_ENV)
    if given is not None:
        candidates.append((f"{RUNTIME_ENV}", given))
    fallback = os.path.join(root, str(uid))
    if given != fallback:
        candidates.append(("fallback", fallback))
    for label, path in candidates:
        why = check_runtime_dir(path, uid)
        if why is None:
            runtime = path
            break
        problems.append(f"{label} rejected: {why}" if label != "fallback" else why)
    if runtime is None:
        # Nothing to trust: make sure no tool we start follows the untrusted values either.
        env.pop(RUNTIME_ENV, None)
        env.pop(BUS_ENV, None)
        return BusInfo(
            manager=ManagerKind.USER,
            runtime_dir=None,
            bus_path=None,
            bus_ok=False,
            private_socket=None,
            env=env,
            detail="no usable runtime dir: " + "; ".join(problems),
        )
    env[RUNTIME_ENV] = runtime
    bus_path = os.path.join(runtime, "bus")
    why_bus = _check_socket(bus_path, uid)
    if why_bus is None:
        env[BUS_ENV] = f"unix:path={bus_path}"
    else:
        env.pop(BUS_ENV, None)
        problems.append(why_bus)
    return BusInfo(
        manager=ManagerKind.USER,
        runtime_dir=runtime,
        bus_path=bus_path,
        bus_ok=why_bus is None,
        private_socket=os.path.join(runtime, "systemd", "private"),
        env=env,
        detail="; ".join(problems),
    )


def _system(environ: Mapping[str, str], private: str) -> BusInfo:
    env = dict(environ)
    # The system manager is reached through the system bus; a session address is irrelevant.
    env.pop(BUS_ENV, None)
    why = _check_socket(SYSTEM_BUS, 0)
    return BusInfo(
        manager=ManagerKind.SYSTEM,
        runtime_dir=None,
        bus_path=SYSTEM_BUS,
        bus_ok=why is None,
        private_socket=private,
        env=env,
        detail=why or "",
    )


def manager_env(info: BusInfo, unit: str) -> dict[str, str]:
    """The variables through which a program placed in ``unit`` asks the manager ``info``
    found about that unit (see :attr:`scope.abc.LaunchSpec.manager_env`); empty when no
    ``systemctl`` is on the discovered environment's ``PATH`` (it then cannot ask)."""
    tool = shutil.which("systemctl", path=info.env.get("PATH") or os.defpath)
    if tool is None:
        return {}
    found = {UNIT_ENV: unit, SYSTEMCTL_ENV: tool, MANAGER_ENV: info.manager.value}
    for key in (RUNTIME_ENV, BUS_ENV):
        value = info.env.get(key)
        if value is not None:
            found[key] = value
    return found
