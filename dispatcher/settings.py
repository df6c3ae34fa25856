"""The whole config schema: the dispatcher's own sections plus those of scope/ and registry/.

``Settings`` is the root record that config.yaml is validated against. Every key is documented
in docs/configuration.md (a test checks that no key is missing there).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from registry.settings import RegistrySettings
from scope.schema import (
    Argv,
    Bool,
    Choice,
    Duration,
    Int,
    Invalid,
    ListOf,
    MapOf,
    Optional,
    Record,
    Str,
    Zone,
    setting,
)
from scope.settings import ScopeSettings

JOB_ID_PATTERN = r"[a-z0-9][a-z0-9_-]*"
ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"


class OverlapPolicy(enum.StrEnum):
    """What a cron fire does while the job's previous run is still going."""

    SKIP = "skip"
    QUEUE_ONE = "queue_one"
    REPLACE = "replace"
    ALLOW = "allow"


class CatchUpPolicy(enum.StrEnum):
    """What happens to fires missed while nothing was running."""

    LATEST = "latest"
    SKIP = "skip"
    ALL = "all"


def _env_kind() -> MapOf:
    return MapOf(
        Str(nonempty=False), ENV_NAME_PATTERN, "environment names are [A-Za-z_][A-Za-z0-9_]*"
    )


def _check_command(command: str | tuple[str, ...], shell: bool) -> None:
    if isinstance(command, str) and not shell:
        raise Invalid(
            "a command string needs 'shell: true'; write the command as an argv list "
            '(e.g. ["backup", "--full"]) or set shell: true',
            ("command",),
        )


@dataclass(frozen=True, kw_only=True)
class CronJob:
    """One entry of ``cron.jobs``."""

    id: str = setting(
        kind=Str(JOB_ID_PATTERN, "ids are lower-case letters, digits, '-' and '_'"),
        doc="Unique job id ([a-z0-9][a-z0-9_-]*).",
    )
    schedule: str | None = setting(
        None,
        kind=Optional(Str()),
        doc="Crontab expression (5 fields, Vixie/cronie semantics) or @hourly, @daily, @weekly, "
        "@monthly, @yearly, @annually, @midnight. Exactly one of schedule and every.",
    )
    every: float | None = setting(
        None,
        kind=Optional(Duration(min=1)),
        doc="Fixed interval (duration), anchored to the Unix epoch so fires are stable across "
        "restarts. Exactly one of schedule and every.",
    )
    timezone: str | None = setting(
        None, kind=Optional(Zone()), doc="IANA time zone of the schedule (default: the host's)."
    )
    command: str | tuple[str, ...] = setting(
        kind=Argv(), doc="argv list to run; a single string only with shell: true."
    )
    shell: bool = setting(False, kind=Bool(), doc="Run a string command through /bin/sh -c.")
    cwd: str | None = setting(
        None, kind=Optional(Str()), doc="Working directory (default: the state dir)."
    )
    env: dict[str, str] = setting(
        default_factory=dict, kind=_env_kind(), doc="Extra environment variables."
    )
    env_file: str | None = setting(
        None,
        kind=Optional(Str()),
        doc="File of NAME=value lines added to the environment; must be ours and mode 0600.",
    )
    timeout: float | None = setting(
        None,
        kind=Optional(Duration(min=1)),
        doc="Kill the run after this long (outcome timed_out).",
    )
    jitter: float = setting(
        0.0, kind=Duration(min=0), doc="Random delay up to this long before each fire (recorded)."
    )
    overlap: OverlapPolicy = setting(
        OverlapPolicy.SKIP,
        kind=Choice(OverlapPolicy),
        doc="While the previous run is going: skip (record skipped_overlap), queue_one, "
        "replace (kill it, record replaced) or allow.",
    )
    catch_up: CatchUpPolicy = setting(
        CatchUpPolicy.LATEST,
        kind=Choice(CatchUpPolicy),
        doc="Fires missed during downtime: latest (run the most recent once), skip or all.",
    )
    catch_up_window: float = setting(
        3600.0,
        kind=Duration(min=0),
        doc="Only missed fires this recent are caught up; older ones are recorded missed.",
    )
    catch_up_max: int = setting(
        100, kind=Int(min=1), doc="At most this many missed fires run under catch_up: all."
    )
    enabled: bool = setting(True, kind=Bool(), doc="Disabled jobs never fire.")
    pty: bool = setting(False, kind=Bool(), doc="Run the worker on a pseudo-terminal.")
    on_failure: tuple[str, ...] | None = setting(
        None,
        kind=Optional(Argv()),
        doc="argv run after a failed, timed-out or refused fire, with the fire's details in "
        "DISPATCH_* environment variables.",
    )

    def check(self) -> None:
        """Cross-key rules: exactly one of schedule/every; string commands need shell."""
        if (self.schedule is None) == (self.every is None):
            raise Invalid("give exactly one of 'schedule' and 'every'", ("schedule",))
        _check_command(self.command, self.shell)
        if isinstance(self.on_failure, str):
            raise Invalid("on_failure must be an argv list", ("on_failure",))


@dataclass(frozen=True, kw_only=True)
class CronSettings:
    """The ``cron:`` section."""

    require_restart_safe_scope: bool = setting(
        False,
        kind=Bool(),
        doc="Refuse (spawn_refused) instead of degrading when a cron worker cannot get a "
        "restart-safe scope.",
    )
    max_concurrent: int = setting(
        16, kind=Int(min=1), doc="Cap on cron workers running at once, host-wide."
    )
    jobs: tuple[CronJob, ...] = setting(
        default_factory=tuple, kind=ListOf(Record(CronJob)), doc="The cron jobs."
    )

    def check(self) -> None:
        """Job ids are unique."""
        seen: dict[str, int] = {}
        for index, job in enumerate(self.jobs):
            if job.id in seen:
                raise Invalid(
                    f"duplicate job id {job.id!r} (also jobs[{seen[job.id]}])",
                    ("jobs", index, "id"),
                )
            seen[job.id] = index


@dataclass(frozen=True, kw_only=True)
class Assignee:
    """One entry of ``kanban.assignees``: how a card's worker is started."""

    command: str | tuple[str, ...] = setting(
        kind=Argv(), doc="argv list of the worker; a single string only with shell: true."
    )
    shell: bool = setting(False, kind=Bool(), doc="Run a string command through /bin/sh -c.")
    cwd: str | None = setting(
        None, kind=Optional(Str()), doc="Working directory (default: the state dir)."
    )
    env: dict[str, str] = setting(
        default_factory=dict, kind=_env_kind(), doc="Extra environment variables."
    )
    env_file: str | None = setting(
        None,
        kind=Optional(Str()),
        doc="File of NAME=value lines added to the environment; must be ours and mode 0600.",
    )
    max_in_progress: int | None = setting(
        None, kind=Optional(Int(min=1)), doc="Cap on this assignee's running cards."
    )
    timeout: float | None = setting(
        None,
        kind=Optional(Duration(min=1)),
        doc="Kill the worker after this long (outcome timed_out, counts as a failure).",
    )
    pty: bool = setting(False, kind=Bool(), doc="Run the worker on a pseudo-terminal.")

    def check(self) -> None:
        """String commands need shell."""
        _check_command(self.command, self.shell)


@dataclass(frozen=True, kw_only=True)
class KanbanSettings:
    """The ``kanban:`` section."""

    degrade_without_scope: bool = setting(
        False,
        kind=Bool(),
        doc="Start kanban workers unscoped (degraded: they die with the caller's unit) instead "
        "of refusing when no restart-safe scope can be made.",
    )
    max_in_progress: int = setting(8, kind=Int(min=1), doc="Cap on running cards, all assignees.")
    failure_limit: int = setting(
        2,
        kind=Int(min=1),
        doc="Consecutive counted failures that block a card (breaker); per-card override.",
    )
    tempfail_limit: int = setting(
        10, kind=Int(min=1), doc="Exit-75 retries in a row before the card is blocked (transient)."
    )
    transient_block: float = setting(
        300.0, kind=Duration(min=0), doc="How long a transient block lasts before ready again."
    )
    infrastructure_cooldown: float = setting(
        300.0,
        kind=Duration(min=0),
        doc="Spacing of retries after a spawn was refused for lack of a scope (0: every tick).",
    )
    assignees: dict[str, Assignee] = setting(
        default_factory=dict,
        kind=MapOf(Record(Assignee), JOB_ID_PATTERN, "assignee names are [a-z0-9][a-z0-9_-]*"),
        doc="Worker definitions by assignee name.",
    )


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


SCHEMA = Record(Settings)
"""The root record config.yaml is validated against."""
