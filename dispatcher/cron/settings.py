"""The ``cron:`` section of config.yaml."""

from __future__ import annotations

import enum
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
from dispatcher.cron.crontab import parse as parse_crontab
from dispatcher.cron.errors import CronExpressionError
from dispatcher.launch.retry import RetryPolicy
from scope.foundation.schema import (
    Argv,
    Bool,
    Choice,
    Duration,
    Int,
    Invalid,
    ListOf,
    Optional,
    Record,
    Str,
    Zone,
    setting,
)
from scope.resources import ScopeProperties


class OverlapPolicy(enum.StrEnum):
    """What a cron fire does while the job's previous run is still going."""

    SKIP = "skip"
    QUEUE_ONE = "queue_one"
    REPLACE = "replace"
    ALLOW = "allow"


class OnExhausted(enum.StrEnum):
    """What a job does after one of its fires failed every attempt."""

    NONE = "none"
    """Nothing more: the fire is recorded failed and the next fire runs as scheduled."""
    PAUSE = "pause"
    """Pause the job (as ``dispatch cron pause`` would) until ``dispatch cron resume``."""


class CatchUpPolicy(enum.StrEnum):
    """What happens to fires missed while nothing was running."""

    LATEST = "latest"
    SKIP = "skip"
    ALL = "all"


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
    offset: float = setting(
        0.0,
        kind=Duration(min=0),
        doc="Phase of an every: schedule: fires at Unix epoch + offset + k * every "
        "(must be less than every; only with every).",
    )
    timezone: str | None = setting(
        None, kind=Optional(Zone()), doc="IANA time zone of the schedule (default: the host's)."
    )
    command: str | tuple[str, ...] = command_setting()
    shell: bool = shell_setting()
    cwd: str | None = cwd_setting()
    env: dict[str, str] = env_setting()
    env_file: str | None = env_file_setting()
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
    pty: bool = pty_setting()
    resources: ScopeProperties = resources_setting()
    on_failure: tuple[str, ...] | None = setting(
        None,
        kind=Optional(Argv()),
        doc="argv run after a failed, timed-out or refused fire (after its last try), with the "
        "fire's details in DISPATCH_* environment variables.",
    )
    retry: RetryPolicy | None = setting(
        None,
        kind=Optional(Record(RetryPolicy)),
        doc="This job's retry policy: a failed try is retried within its fire, under the same "
        "fire key (default: cron.retry).",
    )
    on_exhausted: OnExhausted = setting(
        OnExhausted.NONE,
        kind=Choice(OnExhausted),
        doc="After a fire failed every attempt: none, or pause (the job fires again after "
        "dispatch cron resume).",
    )
    uses: tuple[str, ...] = uses_setting()

    def check(self) -> None:
        """Cross-key rules: exactly one of schedule/every; string commands need shell."""
        if (self.schedule is None) == (self.every is None):
            raise Invalid("give exactly one of 'schedule' and 'every'", ("schedule",))
        if self.schedule is not None:
            try:
                parse_crontab(self.schedule)
            except CronExpressionError as err:
                raise Invalid(err.message, ("schedule",)) from None
        if self.offset:
            if self.every is None:
                raise Invalid("offset only applies to every: schedules", ("offset",))
            if self.offset >= self.every:
                raise Invalid("offset must be less than every", ("offset",))
        check_command(self.command, self.shell)
        if isinstance(self.on_failure, str):
            raise Invalid("on_failure must be an argv list", ("on_failure",))


_NEEDS_ATTEMPTS = (
    "a cron retry policy needs attempts (tries per fire, the first included); add attempts: N"
)


def _check_policy(policy: RetryPolicy | None, path: tuple[str | int, ...]) -> None:
    """What a cron retry policy must say, and what it cannot do yet."""
    if policy is None:
        return
    if policy.attempts is None:
        raise Invalid(_NEEDS_ATTEMPTS, (*path, "attempts"))
    for index, rule in enumerate(policy.rules):
        if rule.resources is not None:
            raise Invalid(
                "a retry rule's resources apply to kanban workers only for now; set the "
                "job's resources instead",
                (*path, "rules", index, "resources"),
            )


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
        16,
        kind=Int(min=1),
        doc="Cap on cron workers running at once, host-wide (fires beyond it wait for a slot).",
    )
    history_ttl: float = setting(
        30 * 86400.0,
        kind=Duration(min=3600),
        doc="Ledger rows of finished fires older than this are pruned (hourly); the newest "
        "row of each job is always kept.",
    )
    on_time_grace: float = setting(
        60.0,
        kind=Duration(min=0),
        doc="A fire at most this late still runs as a normal fire; later ones were missed "
        "during downtime and follow the job's catch_up policy.",
    )
    retry: RetryPolicy | None = setting(
        None,
        kind=Optional(Record(RetryPolicy)),
        doc="Retry policy of every job without its own (default: none, a failed fire waits for "
        "the next one); retry.attempts is required.",
    )
    tempfail_limit: int = setting(
        10,
        kind=Int(min=1),
        doc="Uncounted retries in a row of one fire (exit 75, rules with counted: false, a "
        "worker's defer, infrastructure refusals) before it ends with its last outcome.",
    )
    jobs: tuple[CronJob, ...] = setting(
        default_factory=tuple, kind=ListOf(Record(CronJob)), doc="The cron jobs."
    )

    def policy(self, job: CronJob) -> RetryPolicy | None:
        """The retry policy a job's fires follow: its own, else ``cron.retry``, else none."""
        return job.retry if job.retry is not None else self.retry

    def check(self) -> None:
        """Job ids are unique; a cron retry policy says how many tries a fire gets."""
        _check_policy(self.retry, ("retry",))
        seen: dict[str, int] = {}
        for index, job in enumerate(self.jobs):
            _check_policy(job.retry, ("jobs", index, "retry"))
            if job.id in seen:
                raise Invalid(
                    f"duplicate job id {job.id!r} (also jobs[{seen[job.id]}])",
                    ("jobs", index, "id"),
                )
            seen[job.id] = index
