"""The ``scope:`` section of config.yaml."""

from __future__ import annotations

from dataclasses import dataclass

from scope.abc import BackendKind, ManagerKind, ScopeProperties
from scope.foundation.schema import Choice, Duration, Int, Optional, Size, setting


@dataclass(frozen=True, kw_only=True)
class ScopeSettings:
    """How and where transient scopes are made."""

    manager: ManagerKind = setting(
        ManagerKind.AUTO,
        kind=Choice(ManagerKind),
        doc="Which systemd manager places workers: auto (the user manager; root may fall back "
        "to the system manager when no user manager is reachable), user or system.",
    )
    backend: BackendKind = setting(
        BackendKind.AUTO,
        kind=Choice(BackendKind),
        doc="How scopes are created: auto (D-Bus first, systemd-run when D-Bus cannot be "
        "used), dbus or systemd-run.",
    )
    probe_ttl: float = setting(
        60.0,
        kind=Duration(min=0),
        doc="How long a probe verdict (scoping works / does not) is trusted before re-probing.",
    )
    probe_timeout: float = setting(
        3.0,
        kind=Duration(min=0.1),
        doc="Bound on one probe; a probe that only timed out is retried once with "
        "probe_retry_timeout before being cached as down.",
    )
    probe_retry_timeout: float = setting(
        10.0, kind=Duration(min=0.1), doc="Bound on the retry of a probe that timed out."
    )
    memory_max: int | None = setting(
        None,
        kind=Optional(Size(min=1)),
        doc="MemoryMax= for every worker scope (none by default: a silent memory cap on long "
        "agent runs is a trap).",
    )
    tasks_max: int | None = setting(
        None,
        kind=Optional(Int(min=1)),
        doc="TasksMax= for every worker scope (none: the manager's default applies).",
    )
    runtime_max: float | None = setting(
        None,
        kind=Optional(Duration(min=1)),
        doc="RuntimeMaxSec= for every worker scope (none: no limit from the scope itself).",
    )

    def properties(self) -> ScopeProperties:
        """The unit properties a real spawn (and the probe) applies."""
        return ScopeProperties(
            memory_max=self.memory_max, tasks_max=self.tasks_max, runtime_max=self.runtime_max
        )
