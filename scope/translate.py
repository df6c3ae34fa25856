"""The one place where foreign errors become ours.

D-Bus errors (dbus-next's ``DBusError`` and error replies), connection errors (``OSError``,
dbus-next's ``AuthError``), ``systemd-run``/``systemctl`` failures (exit status + stderr) and
timeouts are mapped here onto :mod:`scope.errors`; nothing above scope/ sees a dbus-next
exception or a ``CalledProcessError``. The backends catch broadly and call :func:`translate`.

The scope-specific leaves defined here::

    ScopeError
    ├── ScopeStartFailed          the manager (or systemd-run) could not create the scope
    │   └── ScopeTimeout          ... within its bound (``timed_out`` is True)
    └── BusError                  (scope.errors) no usable connection to the manager
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
from typing import Any

from scope.errors import BusError, ScopeError

__all__ = [
    "NO_SUCH_UNIT",
    "ScopeStartFailed",
    "ScopeTimeout",
    "from_dbus_reply",
    "from_process",
    "is_not_loaded",
    "translate",
]

NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"

# Error names that mean "nobody usable at the other end", not "the manager said no".
_UNREACHABLE_NAMES = {
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.Disconnected",
    "org.freedesktop.DBus.Error.NoServer",
    "org.freedesktop.DBus.Error.Spawn.ChildExited",
    "org.freedesktop.DBus.Error.TimedOut",
}

# systemd-run/systemctl stderr fragments that mean "could not reach the manager".
_UNREACHABLE_TEXT = (
    "Failed to connect to bus",
    "Failed to create bus connection",
    "Failed to connect to user scope bus",
    "No such file or directory",
    "Connection refused",
    "Transport endpoint is not connected",
    "$DBUS_SESSION_BUS_ADDRESS and $XDG_RUNTIME_DIR not defined",
    "XDG_RUNTIME_DIR",
)

_NOT_LOADED_TEXT = ("not loaded", "not found", "NoSuchUnit")


class ScopeStartFailed(ScopeError):
    """A scope could not be created; ``backend``, ``unit`` and ``detail`` say how and why."""

    def __init__(self, detail: str, *, backend: str, unit: str | None, **fields: Any) -> None:
        super().__init__(backend=backend, unit=unit, detail=detail, **fields)

    def describe(self) -> str:
        unit = self.fields.get("unit") or "a scope"
        return f"could not start {unit} via {self.fields['backend']}: {self.fields['detail']}"


class ScopeTimeout(ScopeStartFailed):
    """Creating a scope (or a probe) did not finish within its bound."""

    def __init__(self, detail: str, *, backend: str, unit: str | None, **fields: Any) -> None:
        super().__init__(detail, backend=backend, unit=unit, timed_out=True, **fields)


def _bus_error(detail: str, *, backend: str, unit: str | None, **fields: Any) -> BusError:
    return BusError(
        f"cannot reach the systemd manager via {backend}: {detail}",
        backend=backend,
        unit=unit,
        detail=detail,
        **fields,
    )


def from_dbus_reply(name: str, text: str, *, unit: str | None, op: str) -> ScopeError:
    """An error reply from the bus or the manager."""
    detail = f"{op}: {name}: {text}"
    if name in _UNREACHABLE_NAMES:
        return _bus_error(detail, backend="dbus", unit=unit, error_name=name)
    return ScopeStartFailed(detail, backend="dbus", unit=unit, error_name=name)


def translate(exc: BaseException, *, backend: str, unit: str | None, op: str) -> ScopeError:
    """Map any exception raised while talking to systemd onto our tree (ours pass through)."""
    if isinstance(exc, ScopeError):
        return exc
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | concurrent.futures.TimeoutError):
        return ScopeTimeout(f"{op} timed out", backend=backend, unit=unit)
    name = getattr(exc, "type", None)
    text = getattr(exc, "text", None)
    if isinstance(name, str) and isinstance(text, str):
        # dbus_next.errors.DBusError, matched by shape so only this module knows the library.
        return from_dbus_reply(name, text, unit=unit, op=op)
    if isinstance(exc, OSError):
        reason = exc.strerror or errno.errorcode.get(exc.errno or 0, "") or str(exc)
        where = f" ({exc.filename})" if exc.filename else ""
        return _bus_error(f"{op}: {reason}{where}", backend=backend, unit=unit)
    kind = type(exc).__name__
    if kind in ("AuthError", "InvalidAddressError", "EOFError"):
        return _bus_error(f"{op}: {kind}: {exc}", backend=backend, unit=unit)
    return ScopeStartFailed(f"{op}: {kind}: {exc}", backend=backend, unit=unit)


def from_process(
    argv0: str, returncode: int | None, stderr: str, *, backend: str, unit: str | None
) -> ScopeError:
    """A ``systemd-run``/``systemctl`` call that failed with ``returncode`` and ``stderr``."""
    text = " ".join(stderr.split()) or "no diagnostics"
    status = "was killed" if returncode is None or returncode < 0 else f"exited {returncode}"
    detail = f"{argv0} {status}: {text}"
    if any(fragment in stderr for fragment in _UNREACHABLE_TEXT):
        return _bus_error(detail, backend=backend, unit=unit, returncode=returncode)
    return ScopeStartFailed(detail, backend=backend, unit=unit, returncode=returncode)


def is_not_loaded(error: BaseException | str) -> bool:
    """Whether an error (or a tool's stderr) says the unit is not loaded: that is "stopped"."""
    if isinstance(error, str):
        return any(fragment in error for fragment in _NOT_LOADED_TEXT)
    return getattr(error, "fields", {}).get("error_name") == NO_SUCH_UNIT or any(
        fragment in str(error) for fragment in _NOT_LOADED_TEXT
    )
