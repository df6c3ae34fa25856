"""The cron ledger's records: what every ledger backend stores and hands out.

The contract (:mod:`dispatcher.cron.abc`) and every implementation (in memory
:mod:`dispatcher.cron.memory`, SQLite :mod:`dispatcher.cron.ledger`, PostgreSQL
:mod:`dispatcher.cluster.ledger`) import them from here: a row (:class:`FireRecord`), its life
cycle (:class:`Status`, :class:`Kind`), a job's scheduling state (:class:`JobState`).

Row status (internal life cycle) versus outcome (the shared vocabulary, final)::

    claimed ─► spawning ─► running ─► done(completed | failed | timed_out | lost | ...)
    queued  ─► claimed                 done(skipped_overlap | missed | coalesced | replaced ...)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any, Protocol

from dispatcher.launch.outcome import Outcome

__all__ = [
    "ACTIVE",
    "COLUMNS",
    "EMPTY_ROW",
    "FAILURE_OUTCOMES",
    "WAITING",
    "FireRecord",
    "JobState",
    "Kind",
    "Status",
]


class Row(Protocol):
    """A stored row read by column name (``sqlite3.Row``, a psycopg dict row, a dict)."""

    def __getitem__(self, key: str, /) -> Any: ...


class Status(enum.StrEnum):
    """Where a ledger row is in its life cycle (``done`` rows carry the outcome)."""

    CLAIMED = "claimed"
    SPAWNING = "spawning"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


FAILURE_OUTCOMES = frozenset(
    {
        Outcome.FAILED,
        Outcome.TIMED_OUT,
        Outcome.LOST,
        Outcome.FAILED_START,
        Outcome.SPAWN_REFUSED,
        Outcome.TEMPFAIL,
        Outcome.CONFIG_ERROR,
        Outcome.OOM_KILLED,
    }
)
"""Outcomes after which a job's ``on_failure`` command runs."""

WAITING = "waiting: "
"""How a held fire's row begins its ``error`` while it waits to start (see
:mod:`dispatcher.cron.hold`; cleared when it starts)."""

ACTIVE = (Status.CLAIMED, Status.SPAWNING, Status.RUNNING)
"""Statuses of a fire that counts as "the job is running" for the overlap policy."""


class Kind(enum.StrEnum):
    """Scheduled occurrences and manual ``dispatch cron run`` fires have separate keys."""

    SCHEDULE = "schedule"
    MANUAL = "manual"


@dataclass(frozen=True, kw_only=True)
class FireRecord:
    """One ledger row."""

    id: int
    fire_key: str
    job_id: str
    kind: Kind
    nominal_wall: str
    fold: int
    zone: str
    nominal: float
    decided_at: float
    due_at: float | None
    actual: float | None
    status: Status
    outcome: Outcome | None
    catch_up: bool
    jitter: float
    placement: str | None
    session_id: str | None
    exit_code: int | None
    signal: str | None
    started_at: float | None
    ended_at: float | None
    error: str | None
    infrastructure: bool
    log_path: str | None
    claimant: str | None
    on_failure_session: str | None

    @property
    def shown_outcome(self) -> str:
        """The outcome for display: the final one, else ``queued`` (waiting: overlap queue,
        jitter delay or a concurrency slot) or ``running`` (being started, or running)."""
        if self.outcome is not None:
            return self.outcome.value
        return "queued" if self.status in (Status.QUEUED, Status.CLAIMED) else "running"

    @classmethod
    def from_row(cls, row: Row) -> FireRecord:
        """Build from a stored row (a ``SELECT *`` row, or a dict of every column)."""
        data = {name: row[name] for name in COLUMNS}
        data["kind"] = Kind(data["kind"])
        data["status"] = Status(data["status"])
        data["outcome"] = Outcome(data["outcome"]) if data["outcome"] else None
        data["catch_up"] = bool(data["catch_up"])
        data["infrastructure"] = bool(data["infrastructure"])
        return cls(**data)


COLUMNS = tuple(f.name for f in fields(FireRecord))
"""The columns of a row, ``id`` first."""
EMPTY_ROW: dict[str, Any] = {
    **dict.fromkeys(COLUMNS[1:]),
    "fold": 0,
    "catch_up": 0,
    "jitter": 0.0,
    "infrastructure": 0,
}
"""The stored value of every column an insert leaves out (``id`` aside)."""


@dataclass(frozen=True, kw_only=True)
class JobState:
    """Per-job scheduling state shared by every scheduler on the database."""

    job_id: str
    watermark: float | None
    """Every occurrence due at or before this instant has been decided (None: never seen)."""
    paused: bool | None
    """True: paused by ``cron pause``; False: resumed by ``cron resume`` (overrides
    ``enabled: false``); None: follow the config's ``enabled``."""
    paused_at: float | None
