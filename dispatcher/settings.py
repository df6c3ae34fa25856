"""The whole config schema: the dispatcher's own sections plus those of scope/ and registry/.

``Settings`` is the root record that config.yaml is validated against. Every key is documented
in docs/configuration.md (a test checks that no key is missing there). Each package owns its
section: scope/settings.py, registry/settings.py, dispatcher/cron/settings.py,
dispatcher/kanban/settings.py; the gateway's is here.
"""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.cluster.settings import ClusterSettings
from dispatcher.commonsettings import JOB_ID_PATTERN
from dispatcher.cron.settings import CatchUpPolicy, CronJob, CronSettings, OverlapPolicy
from dispatcher.kanban.settings import Assignee, KanbanSettings
from dispatcher.launch.admission import AdmissionSettings
from dispatcher.launch.limits import LimitSpec
from dispatcher.notify.settings import NotifySettings
from registry.settings import RegistrySettings
from scope.foundation.schema import Duration, Invalid, MapOf, Record, setting
from scope.resources import ScopeProperties
from scope.settings import ScopeSettings

__all__ = [
    "SCHEMA",
    "Assignee",
    "CatchUpPolicy",
    "CronJob",
    "CronSettings",
    "KanbanSettings",
    "OverlapPolicy",
    "ServeSettings",
    "Settings",
]


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """The ``serve:`` section (the gateway)."""

    safety_tick: float = setting(
        30.0,
        kind=Duration(min=1),
        doc="Periodic kanban tick that covers any wake-up that was missed.",
    )
    stop_timeout: float = setting(
        5.0, kind=Duration(min=1), doc="Bound on a clean shutdown after SIGTERM."
    )


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The root of config.yaml."""

    scope: ScopeSettings = setting(
        default_factory=ScopeSettings, kind=Record(ScopeSettings), doc="Scope placement."
    )
    registry: RegistrySettings = setting(
        default_factory=RegistrySettings, kind=Record(RegistrySettings), doc="Process registry."
    )
    cron: CronSettings = setting(
        default_factory=CronSettings, kind=Record(CronSettings), doc="Cron scheduler."
    )
    kanban: KanbanSettings = setting(
        default_factory=KanbanSettings, kind=Record(KanbanSettings), doc="Kanban dispatcher."
    )
    serve: ServeSettings = setting(
        default_factory=ServeSettings, kind=Record(ServeSettings), doc="The gateway."
    )
    cluster: ClusterSettings = setting(
        default_factory=ClusterSettings,
        kind=Record(ClusterSettings),
        doc="Cluster mode (several hosts, one PostgreSQL).",
    )
    notify: NotifySettings = setting(
        default_factory=NotifySettings,
        kind=Record(NotifySettings),
        doc="Notifications (webhooks and commands) of chosen events.",
    )
    admission: AdmissionSettings = setting(
        default_factory=AdmissionSettings,
        kind=Record(AdmissionSettings),
        doc="Admission under pressure: this host holds new claims and cron starts while "
        "memory (or CPU) is short. See docs/resources.md.",
    )
    limits: dict[str, LimitSpec] = setting(
        default_factory=dict,
        kind=MapOf(Record(LimitSpec), JOB_ID_PATTERN, "limit names are [a-z0-9][a-z0-9_-]*"),
        doc="Named limits (concurrency and rate of a shared resource) that assignees and cron "
        "jobs take with uses:.",
    )

    def check(self) -> None:
        """Every limit a worker ``uses`` is defined; each worker's resource class fits over
        ``scope.resources`` (``memory_high`` at most the merged ``memory_max``), so a clash is
        a config error, not a refused start."""
        users: list[tuple[tuple[str | int, ...], tuple[str, ...]]] = [
            (("kanban", "assignees", name, "uses"), assignee.uses)
            for name, assignee in self.kanban.assignees.items()
        ]
        users += [(("cron", "jobs", i, "uses"), job.uses) for i, job in enumerate(self.cron.jobs)]
        for path, uses in users:
            for index, name in enumerate(uses):
                if name not in self.limits:
                    known = ", ".join(sorted(self.limits)) or "none are defined"
                    raise Invalid(
                        f"uses the limit {name!r}, which limits: does not define ({known}); "
                        "define it there or remove it here",
                        (*path, index),
                    )
        default = self.scope.properties()
        classes: list[tuple[tuple[str | int, ...], ScopeProperties]] = [
            (("kanban", "assignees", name, "resources"), assignee.resources)
            for name, assignee in self.kanban.assignees.items()
        ]
        classes += [
            (("cron", "jobs", index, "resources"), job.resources)
            for index, job in enumerate(self.cron.jobs)
        ]
        for path, resources in classes:
            try:
                resources.over(default)
            except Invalid as err:
                raise Invalid(f"{err.problem} (over scope.resources)", path + err.path) from None
        self._check_retry_classes(default)

    def _check_retry_classes(self, default: ScopeProperties) -> None:
        """A retry rule's class lands on each worker it may retry: it must fit over that
        worker's class and ``scope.resources`` as well."""
        for name, assignee in self.kanban.assignees.items():
            own = assignee.retry is not None
            policy = assignee.retry if own else self.kanban.retry
            where = ("kanban", "assignees", name, "retry") if own else ("kanban", "retry")
            for index, rule in enumerate(policy.rules if policy else ()):
                if rule.resources is None:
                    continue
                try:
                    rule.resources.over(assignee.resources.over(default))
                except Invalid as err:
                    raise Invalid(
                        f"{err.problem} (over kanban.assignees.{name}.resources and "
                        "scope.resources)",
                        (*where, "rules", index, "resources", *err.path),
                    ) from None

    def classes(self) -> dict[str, ScopeProperties]:
        """Every worker class that sets something, by where it is written, merged over
        ``scope.resources`` (``scope.resources`` itself first): what ``dispatch doctor`` checks
        against this host's controllers."""
        default = self.scope.properties()
        found = {"scope.resources": default} if default.limits else {}
        for name, assignee in self.kanban.assignees.items():
            own = assignee.resources.over(default)
            found[f"kanban.assignees.{name}.resources"] = own
            policy = assignee.retry or self.kanban.retry
            where = f"kanban.assignees.{name}.retry" if assignee.retry else "kanban.retry"
            for index, rule in enumerate(policy.rules if policy else ()):
                if rule.resources is not None:
                    label = f"{where}.rules[{index}].resources (for {name})"
                    found[label] = rule.resources.over(own)
        for job in self.cron.jobs:
            found[f"cron.jobs[{job.id}].resources"] = job.resources.over(default)
        return {key: value for key, value in found.items() if value.limits}


SCHEMA = Record(Settings)
"""The root record config.yaml is validated against."""
