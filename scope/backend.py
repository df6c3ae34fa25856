"""What the real backends add to :class:`~scope.abc.ScopeBackend`: bounded launches and the
unit queries the scoper needs for stop and doctor."""

from __future__ import annotations

import abc

from scope.abc import Launched, LaunchSpec, ScopeBackend, ScopeProperties

__all__ = ["UnitBackend"]


class UnitBackend(ScopeBackend):
    """A backend talking to a real systemd manager."""

    @abc.abstractmethod
    def launch(
        self,
        spec: LaunchSpec,
        unit: str,
        properties: ScopeProperties,
        *,
        timeout: float | None = None,
    ) -> Launched:
        """As :meth:`ScopeBackend.launch`, bounded by ``timeout`` seconds (default: the
        backend's own bound); raises ``ScopeTimeout`` when the bound passes."""

    @abc.abstractmethod
    def control_group(self, unit: str) -> str | None:
        """The unit's ``ControlGroup`` ('' when it has none now), None when not loaded."""

    @abc.abstractmethod
    def manager_version(self) -> str:
        """The manager's version string; raises ``ScopeError`` when it cannot be reached."""

    @abc.abstractmethod
    def manager_control_group(self) -> str:
        """The manager's root cgroup (its ``ControlGroup`` property, e.g.
        ``/user.slice/user-1000.slice/user@1000.service``); raises ``ScopeError`` when it
        cannot be reached."""
