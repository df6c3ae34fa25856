"""Errors of the placement layer: placing or stopping a systemd scope.

The root and the whole tree are in :mod:`scope.foundation.errors`.
"""

from __future__ import annotations

from typing import Any

from scope.foundation.errors import DispatchError


class ScopeError(DispatchError):
    """Placing a process in a systemd scope, or stopping one, failed."""


class ScopeUnavailable(ScopeError):
    """Placement was refused: the caller needs a restart-safe scope and none can be made now.

    ``caller`` is the caller kind, ``cause`` what is missing; the message names the remedy.
    """

    def __init__(self, cause: str, *, caller: str, remedy: str | None = None, **fields: Any):
        super().__init__(remedy=remedy, cause=cause, caller=caller, **fields)

    def describe(self) -> str:
        return (
            f"refused to start a {self.fields['caller']} worker without a restart-safe scope: "
            f"{self.fields['cause']}"
        )


class ClassUnavailable(ScopeUnavailable):
    """A worker's resource class cannot take effect on this host (a controller the manager
    cannot use, a cgroup v2 limit on cgroup v1) and ``best_effort`` is off: the worker is
    refused rather than started unbounded. ``cause`` names each key and why."""

    def describe(self) -> str:
        return (
            f"refused to start a {self.fields['caller']} worker: its resource class cannot "
            f"take effect here: {self.fields['cause']}"
        )


class ManagerLost(ScopeError):
    """A scoped spawn failed because the systemd manager (or its bus) is no longer reachable."""

    def __init__(self, vanished: str, *, remedy: str | None = None, **fields: Any) -> None:
        super().__init__(remedy=remedy, vanished=vanished, **fields)

    def describe(self) -> str:
        return f"the systemd manager became unreachable: {self.fields['vanished']}"


class BusError(ScopeError):
    """The runtime directory or bus socket is missing, unsafe, or not ours."""
