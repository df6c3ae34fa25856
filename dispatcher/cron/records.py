"""The cron ledger's records: what every ledger backend stores and hands out.

The contract (:mod:`dispatcher.cron.abc`) and every implementation (in memory
:mod:`dispatcher.cron.memory`, SQLite :mod:`dispatcher.cron.ledger`, PostgreSQL
:mod:`dispatcher.cluster.ledger`) import them from here: a row (:class:`FireRecord`), its life
cycle (:class:`Status`, :class:`Kind`), a job's scheduling state (:class:`JobState`).

Row status (internal life cycle) versus outcome (the shared vocabulary, final)::

    claimed ─► spawning ─► running ─► done(completed | failed | timed_out | lost | ...)
    queued  ─► claimed        │        done(skipped_overlap | missed | coalesced | replaced ...)
    retry   ─► claimed ◄──────┘ a failed try the job's retry policy retries (same row, same key)

A fire's tries (:class:`Try`, one registry session each) are kept on its row in order; the row's
own session, exit and outcome columns describe the latest try, and ``outcome`` is the fire's
final one.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from dispatcher.launch.outcome import Outcome

__all__ = [
    "ACTIVE",
    "BUSY",
    "COLUMNS",
    "EMPTY_ROW",
    "FAILURE_OUTCOMES",
    "WAITING",
    "FireRecord",
    "JobState",
    "Kind",
    "RetryKind",
    "Status",
    "Try",
    "dump_tries",
    "load_tries",
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
    RETRY = "retry"
    """A try failed and the job's retry policy gave the fire another (at ``retry_at``)."""
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
"""Statuses of a fire whose worker is starting or running."""

BUSY = (*ACTIVE, Status.RETRY)
"""Statuses of a fire that counts as "the job is running" for the overlap policy: a retry
pending is part of its fire, so the next fire meets it as it would meet the running worker."""


class RetryKind(enum.StrEnum):
    """Why a fire waits for its next try."""

    BACKOFF = "backoff"
    """The retry policy's back-off after a failed try."""
    DEFERRED = "deferred"
    """The worker chose the time (``dispatch kanban defer`` inside a cron worker)."""


@dataclass(frozen=True, kw_only=True)
class Try:
    """One ended try of a fire (one registry session, or a spawn that never made one)."""

    attempt: int
    """The attempt it was (an uncounted retry repeats its attempt number)."""
    outcome: Outcome
    counted: bool = True
    """Whether it used one of the policy's attempts."""
    exit_code: int | None = None
    signal: str | None = None
    session_id: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The stored form (JSON-ready)."""
        data = asdict(self)
        data["outcome"] = self.outcome.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Try:
        """From the stored form (unknown keys of a newer writer are left out)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["outcome"] = Outcome(values["outcome"])
        return cls(**values)


def dump_tries(tries: tuple[Try, ...]) -> str:
    """The ``tries`` column's text."""
    return json.dumps([t.to_dict() for t in tries], separators=(",", ":"))


def load_tries(text: str | None) -> tuple[Try, ...]:
    """The ``tries`` column read back."""
    return tuple(Try.from_dict(item) for item in json.loads(text or "[]"))


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
    attempt: int = 1
    """The attempt the latest try is (or the next one will be), 1-based."""
    attempts: int | None = None
    """Tries in all the retry policy gives this fire (None: no retry policy, one try)."""
    retry_at: float | None = None
    """When the next try may start (status ``retry``), or, while a try runs, the time its
    worker deferred the next one to."""
    retry_kind: RetryKind | None = None
    retry_reason: str | None = None
    """Why the next try waits (``backoff, attempt 3 of 4``, or the worker's reason)."""
    tries: tuple[Try, ...] = ()
    """The tries that ended, oldest first."""

    @property
    def shown_outcome(self) -> str:
        """The outcome for display: the final one, else ``queued`` (waiting: overlap queue,
        jitter delay, a concurrency slot or the next try) or ``running`` (being started, or
        running)."""
        if self.outcome is not None:
            return self.outcome.value
        waiting = (Status.QUEUED, Status.CLAIMED, Status.RETRY)
        return "queued" if self.status in waiting else "running"

    @property
    def try_number(self) -> int:
        """The number of the current (or next) try, counting every try, 1-based."""
        return len(self.tries) + 1

    @classmethod
    def from_row(cls, row: Row) -> FireRecord:
        """Build from a stored row (a ``SELECT *`` row, or a dict of every column)."""
        data = {name: row[name] for name in COLUMNS}
        data["kind"] = Kind(data["kind"])
        data["status"] = Status(data["status"])
        data["outcome"] = Outcome(data["outcome"]) if data["outcome"] else None
        data["catch_up"] = bool(data["catch_up"])
        data["infrastructure"] = bool(data["infrastructure"])
        data["retry_kind"] = RetryKind(data["retry_kind"]) if data["retry_kind"] else None
        data["tries"] = load_tries(data["tries"])
        return cls(**data)


COLUMNS = tuple(f.name for f in fields(FireRecord))
"""The columns of a row, ``id`` first."""
EMPTY_ROW: dict[str, Any] = {
    **dict.fromkeys(COLUMNS[1:]),
    "fold": 0,
    "catch_up": 0,
    "jitter": 0.0,
    "infrastructure": 0,
    "attempt": 1,
    "tries": "[]",
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
    paused_reason: str | None = None
    """Why dispatch paused the job itself (``on_exhausted: pause``); None for an operator's
    ``cron pause``."""
