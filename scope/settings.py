"""The ``scope:`` section of config.yaml."""

from __future__ import annotations

from dataclasses import dataclass

from scope.abc import BackendKind, ManagerKind
from scope.foundation.schema import Choice, Duration, Int, Invalid, Optional, Record, Size, setting
from scope.resources import ScopeProperties


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
    resources: ScopeProperties = setting(
        default_factory=ScopeProperties,
        kind=Record(ScopeProperties),
        doc="The default resource class of every worker scope (nothing set: a silent memory "
        "cap on long agent runs is a trap); assignees and cron jobs override it key by key. "
        "See docs/resources.md.",
    )
    memory_max: int | None = setting(
        None,
        kind=Optional(Size(min=1)),
        doc="Alias of scope.resources.memory_max (kept for old files; set only one).",
    )
    tasks_max: int | None = setting(
        None,
        kind=Optional(Int(min=1)),
        doc="Alias of scope.resources.tasks_max (kept for old files; set only one).",
    )
    runtime_max: float | None = setting(
        None,
        kind=Optional(Duration(min=1)),
        doc="Alias of scope.resources.runtime_max (kept for old files; set only one).",
    )

    def check(self) -> None:
        """An alias and its ``resources`` key must not both be set."""
        for key in _ALIASES:
            if getattr(self, key) is not None and getattr(self.resources, key) is not None:
                raise Invalid(
                    f"is an alias of scope.resources.{key}: set only one of the two",
                    (key,),
                )
        try:
            self.properties()
        except Invalid as err:
            # Only an alias can clash here (``resources`` was checked alone): name both.
            raise Invalid(
                f"{err.problem} (over scope.{'/'.join(_set_aliases(self))})",
                ("resources", *err.path),
            ) from None

    def properties(self) -> ScopeProperties:
        """The default class a real spawn (and the probe) applies: ``scope.resources`` with
        the old global keys filled in."""
        aliases = {key: getattr(self, key) for key in _ALIASES}
        return self.resources.over(ScopeProperties(**aliases))


_ALIASES = ("memory_max", "tasks_max", "runtime_max")


def _set_aliases(settings: ScopeSettings) -> list[str]:
    return [key for key in _ALIASES if getattr(settings, key) is not None]
