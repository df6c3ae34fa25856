"""The ``kanban:`` section of config.yaml."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.commonsettings import (
    JOB_ID_PATTERN,
    check_command,
    command_setting,
    cwd_setting,
    env_file_setting,
    env_setting,
    pty_setting,
    resources_setting,
    shell_setting,
    uses_setting,
)
from dispatcher.launch.retry import RetryPolicy
from scope.foundation.errors import Invalid
from scope.foundation.schema import Bool, Duration, Int, MapOf, Optional, Record, setting
from scope.resources import ScopeProperties

FAILURE_LIMIT_DEFAULT = 2
"""``kanban.failure_limit`` when not configured."""


@dataclass(frozen=True, kw_only=True)
class Assignee:
    """One entry of ``kanban.assignees``: how a card's worker is started."""

    command: str | tuple[str, ...] = command_setting()
    shell: bool = shell_setting()
    cwd: str | None = cwd_setting()
    env: dict[str, str] = env_setting()
    env_file: str | None = env_file_setting()
    max_in_progress: int | None = setting(
        None, kind=Optional(Int(min=1)), doc="Cap on this assignee's running cards."
    )
    timeout: float | None = setting(
        None,
        kind=Optional(Duration(min=1)),
        doc="Kill the worker after this long (outcome timed_out, counts as a failure).",
    )
    pty: bool = pty_setting()
    retry: RetryPolicy | None = setting(
        None,
        kind=Optional(Record(RetryPolicy)),
        doc="This assignee's retry policy (default: kanban.retry).",
    )
    resources: ScopeProperties = resources_setting()
    uses: tuple[str, ...] = uses_setting()

    def check(self) -> None:
        """String commands need shell."""
        check_command(self.command, self.shell)


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
    max_in_progress_per_host: int | None = setting(
        None,
        kind=Optional(Int(min=1)),
        doc="Cluster mode: cap on running cards on this host (default: max_in_progress).",
    )
    failure_limit: int | None = setting(
        None,
        kind=Optional(Int(min=1)),
        doc="Consecutive counted failures that block a card (breaker): the kanban name of "
        "retry.attempts, so set one of the two (default 2); per-card override.",
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
    spawn_concurrency: int = setting(
        4,
        kind=Int(min=1, max=64),
        doc="Workers one tick starts at the same time (each start waits for its keeper).",
    )
    assignees: dict[str, Assignee] = setting(
        default_factory=dict,
        kind=MapOf(Record(Assignee), JOB_ID_PATTERN, "assignee names are [a-z0-9][a-z0-9_-]*"),
        doc="Worker definitions by assignee name.",
    )
    retry: RetryPolicy | None = setting(
        None,
        kind=Optional(Record(RetryPolicy)),
        doc="Retry policy of every assignee without its own; retry.attempts is the kanban "
        "failure_limit (default: back-off 10s doubling to 10m, full jitter).",
    )

    def check(self) -> None:
        """``failure_limit`` and ``retry.attempts`` say the same thing: refuse two answers."""
        attempts = self.retry.attempts if self.retry else None
        if None not in (attempts, self.failure_limit) and attempts != self.failure_limit:
            raise Invalid(
                f"conflicts with kanban.failure_limit ({self.failure_limit}): both set the "
                "tries a card gets; keep one",
                ("retry", "attempts"),
            )

    def limit_for(self, assignee: str | None = None) -> int:
        """Tries a card of ``assignee`` gets (its card's ``--failure-limit`` aside): the
        assignee's ``retry.attempts``, else ``kanban.failure_limit`` or ``kanban.retry.attempts``
        (the same setting), else 2."""
        own = self.assignees.get(assignee) if assignee is not None else None
        if own is not None and own.retry is not None and own.retry.attempts is not None:
            return own.retry.attempts
        attempts = self.retry.attempts if self.retry else None
        return self.failure_limit or attempts or FAILURE_LIMIT_DEFAULT
