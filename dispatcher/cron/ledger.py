"""The cron ledger in SQLite: one row per fire decision, and per-job scheduling state, in the
state DB.

A row is keyed by its fire key (unique; for scheduled fires also unique as (job id, nominal wall
time, fold)), so two schedulers sharing the database can never both run one occurrence: whoever
inserts the row first owns it. A row that is to run is inserted *before* anything is spawned
(status ``claimed``), moves to ``spawning`` by compare-and-set just before the spawn and to
``running`` once the session exists; a crash in between leaves a row that the scheduler's
reconcile (:meth:`dispatcher.cron.firing.FireRunner.reconcile`) settles without running the
fire again.

Per-job state (table ``cron_jobs``): the *watermark* (every occurrence due at or before it has
been decided, shared by all schedulers) and the pause override set by ``dispatch cron pause``.
The records and the row life cycle are :mod:`dispatcher.cron.records`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
import sqlite3
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from dispatcher.cron import notices
from dispatcher.cron.abc import LedgerStore, LedgerTx, Take
from dispatcher.cron.history import SqlFireHistory
from dispatcher.cron.records import (
    COLUMNS,
    EMPTY_ROW,
    FireRecord,
    JobState,
    Status,
    Try,
    load_tries,
)
from dispatcher.launch import holds
from dispatcher.launch.holds import Holder, Taking
from dispatcher.launch.limits import Tally, Wants
from dispatcher.launch.outbox import Outbox
from dispatcher.launch.outcome import Outcome

if TYPE_CHECKING:
    from dispatcher.cron.changes import FireChange


@dataclasses.dataclass
class RetryCounts:
    """What :meth:`Ledger.retry_counts` found (``/metrics``)."""

    retries: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    """Retries by (job, reason): ``backoff`` (counted), ``uncounted`` (exit 75, a rule with
    ``counted: false``, infrastructure) or ``deferred`` (the worker chose the time)."""
    fires: dict[str, int] = dataclasses.field(default_factory=dict)
    """Fires that had more than one try, by job."""

    def add(self, job_id: str, tried: Try) -> None:
        """Count one try that was followed by another."""
        if tried.outcome is Outcome.DEFERRED:
            reason = "deferred"
        else:
            reason = "backoff" if tried.counted else "uncounted"
        key = (job_id, reason)
        self.retries[key] = self.retries.get(key, 0) + 1


class Tx(LedgerTx):
    """The operations of one write transaction (see :meth:`Ledger.transaction`).

    The SQL is shared by every SQL backend; ``greatest`` names the two-argument maximum
    (SQLite's scalar ``max``, PostgreSQL's ``GREATEST``)."""

    def __init__(self, conn: Any, greatest: str = "max") -> None:
        self.conn = conn
        self.greatest = greatest
        self.outbox: Outbox | None = None
        """Where settled fires queue their notification (set by the ledger)."""

    def job_states(self, job_ids: Sequence[str] | None = None) -> dict[str, JobState]:
        """The state rows of ``job_ids`` (all when None)."""
        if job_ids is not None and len(job_ids) <= 200:
            # A tick usually looks at a handful of due jobs out of many.
            marks = ", ".join("?" for _ in job_ids)
            rows = self.conn.execute(
                f"SELECT * FROM cron_jobs WHERE job_id IN ({marks})",  # noqa: S608
                list(job_ids),
            ).fetchall()
            return {row["job_id"]: _job_state(row) for row in rows}
        rows = self.conn.execute("SELECT * FROM cron_jobs").fetchall()
        wanted = None if job_ids is None else set(job_ids)
        return {
            row["job_id"]: _job_state(row)
            for row in rows
            if wanted is None or row["job_id"] in wanted
        }

    def all_open_rows(self) -> list[FireRecord]:
        """Every row that is not done, oldest first (few: running, waiting)."""
        rows = self.conn.execute(
            "SELECT * FROM cron_fires WHERE status != 'done' ORDER BY id"
        ).fetchall()
        return [FireRecord.from_row(row) for row in rows]

    def set_watermark(self, job_id: str, watermark: float, now: float) -> None:
        """Move the job's watermark forward (never back)."""
        self.conn.execute(_watermark_sql(self.greatest), (job_id, watermark, now))

    def set_watermarks(self, job_ids: Sequence[str], watermark: float) -> None:
        """Move several jobs' watermarks forward to ``watermark`` (never back)."""
        self.conn.executemany(
            _watermark_sql(self.greatest), [(job_id, watermark, watermark) for job_id in job_ids]
        )

    def existing_keys(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are already in the ledger."""
        found: set[str] = set()
        for start in range(0, len(keys), 500):
            chunk = list(keys[start : start + 500])
            marks = ", ".join("?" for _ in chunk)
            found.update(
                row[0]
                for row in self.conn.execute(
                    f"SELECT fire_key FROM cron_fires WHERE fire_key IN ({marks})",  # noqa: S608
                    chunk,
                )
            )
        return found

    def insert_many(self, rows: Sequence[dict[str, Any]]) -> list[int]:
        """Insert rows whose keys are known to be new (checked with :meth:`existing_keys` in
        this transaction, which holds the write lock); returns their ids in order."""
        if not rows:
            return []
        names = COLUMNS[1:]
        pick = operator.itemgetter(*names)
        self.conn.executemany(insert_sql(names), [pick({**EMPTY_ROW, **row}) for row in rows])
        keys = [row["fire_key"] for row in rows]
        ids: dict[str, int] = {}
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            ids.update(
                (row[1], row[0])
                for row in self.conn.execute(
                    f"SELECT id, fire_key FROM cron_fires WHERE fire_key IN ({marks})",  # noqa: S608
                    chunk,
                )
            )
        found = [ids[key] for key in keys]
        self.notify_new(found)
        return found

    def open_rows(self, job_id: str) -> list[FireRecord]:
        """The job's rows that are not done (claimed, spawning, queued, running), oldest first."""
        rows = self.conn.execute(
            "SELECT * FROM cron_fires WHERE job_id = ? AND status != 'done' ORDER BY id",
            (job_id,),
        ).fetchall()
        return [FireRecord.from_row(row) for row in rows]

    def insert(self, **values: Any) -> int | None:
        """Insert a row; None when its fire key (or occurrence) is already in the ledger."""
        try:
            cursor = self.conn.execute(insert_sql(tuple(values)), tuple(values.values()))
        except sqlite3.IntegrityError:
            return None
        if cursor.lastrowid is not None:
            self.notify_new([cursor.lastrowid])
        return cursor.lastrowid

    def notify_new(self, row_ids: Sequence[int]) -> None:
        """Queue the messages of rows inserted already settled (``missed``), in this
        transaction."""
        if self.outbox is not None and row_ids:
            notices.fires(self.conn, self.outbox, row_ids)

    def update(self, row_id: int, expect: Sequence[Status], change: FireChange) -> bool:
        """Compare-and-set: update the row only if its status is one of ``expect``."""
        return _update(self.conn, row_id, expect, change, self.outbox)

    def set_paused(self, job_id: str, paused: bool, now: float, reason: str | None = None) -> bool:
        """Pause (``reason``: dispatch paused it itself) or resume; False when the job already
        was in that state (see :meth:`LedgerTx.set_paused`)."""
        conn = self.conn
        row = conn.execute("SELECT * FROM cron_jobs WHERE job_id = ?", (job_id,)).fetchone()
        current = _job_state(row) if row else None
        if current is not None and current.paused is paused:
            return False
        if paused:
            conn.execute(
                "INSERT INTO cron_jobs (job_id, paused, paused_at, paused_reason, updated_at)"
                " VALUES (?, 1, ?, ?, ?) ON CONFLICT(job_id) DO UPDATE SET paused = 1,"
                " paused_at = excluded.paused_at, paused_reason = excluded.paused_reason,"
                " updated_at = excluded.updated_at",
                (job_id, now, reason, now),
            )
            if self.outbox is not None:
                notices.paused(conn, self.outbox, job_id, now, reason)
        else:
            conn.execute(
                "INSERT INTO cron_jobs (job_id, paused, watermark, updated_at)"  # noqa: S608
                " VALUES (?, 0, ?, ?) ON CONFLICT(job_id) DO UPDATE SET paused = 0,"
                f" paused_at = NULL, paused_reason = NULL, {_later_watermark(self.greatest)},"
                " updated_at = excluded.updated_at",
                (job_id, now, now),
            )
        return True


class Ledger(SqlFireHistory, LedgerStore):
    """Reads and writes the cron tables of a :class:`~registry.store.database.StateDB`.

    Its SQL serves every SQL backend: a subclass names its transaction class and its
    two-argument maximum (see :class:`dispatcher.cluster.ledger.PgLedger`)."""

    TX: type[Tx] = Tx
    GREATEST = "max"

    def __init__(self, db: Any) -> None:
        self.db = db
        self.outbox: Outbox | None = None
        """Where settled fires queue their notification (None: nobody listens)."""

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Tx]:
        """One write transaction: every decision of a tick commits (or not) together."""
        with self.db.write() as conn:
            tx = self.TX(conn, self.GREATEST)
            tx.outbox = self.outbox
            yield tx

    # -- job state ---------------------------------------------------------------------------

    def job_states(self) -> dict[str, JobState]:
        """Every job's state row."""
        with self.db.read() as conn:
            rows = conn.execute("SELECT * FROM cron_jobs").fetchall()
        return {row["job_id"]: _job_state(row) for row in rows}

    def set_paused(self, job_id: str, paused: bool, now: float, reason: str | None = None) -> bool:
        """Pause or resume in its own transaction (see :meth:`Tx.set_paused`)."""
        with self.transaction() as tx:
            return tx.set_paused(job_id, paused, now, reason)

    def defer(
        self, fire_key: str, *, session_id: str | None, until: float, reason: str | None
    ) -> bool:
        """Store a worker's deferral on its fire's try in progress (see the contract)."""
        with self.db.write() as conn:
            cursor = conn.execute(
                "UPDATE cron_fires SET retry_at = ?, retry_kind = 'deferred', retry_reason = ?"
                " WHERE fire_key = ? AND status IN ('spawning', 'running')"
                " AND attempts IS NOT NULL AND (session_id IS NULL OR session_id = ?)",
                (until, reason, fire_key, session_id),
            )
            return bool(cursor.rowcount == 1)

    # -- rows --------------------------------------------------------------------------------

    def get(self, row_id: int) -> FireRecord:
        """The row with this id (KeyError when absent)."""
        with self.db.read() as conn:
            row = conn.execute("SELECT * FROM cron_fires WHERE id = ?", (row_id,)).fetchone()
        if row is None:
            raise KeyError(row_id)
        return FireRecord.from_row(row)

    def by_key(self, fire_key: str) -> FireRecord | None:
        """The row with this fire key, if any."""
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT * FROM cron_fires WHERE fire_key = ?", (fire_key,)
            ).fetchone()
        return FireRecord.from_row(row) if row else None

    def update(self, row_id: int, expect: Sequence[Status], change: FireChange) -> bool:
        """Compare-and-set on the status (see :meth:`Tx.update`), in its own transaction."""
        with self.db.write() as conn:
            return _update(conn, row_id, expect, change, self.outbox)

    def take(self, row_id: int, change: FireChange, wants: Wants, *, now: float) -> Take:
        """See :meth:`LedgerStore.take` (the write lock serializes every taking of limits)."""
        with self.transaction() as tx:
            return self._take(tx, row_id, change, wants, now, host=None)

    @staticmethod
    def _take(
        tx: Tx, row_id: int, change: FireChange, wants: Wants, now: float, *, host: str | None
    ) -> Take:
        """:meth:`take` inside ``tx``, at ``now`` on the ledger's clock, for ``host``."""
        row = tx.conn.execute("SELECT status FROM cron_fires WHERE id = ?", (row_id,)).fetchone()
        if row is None or row[0] != Status.CLAIMED.value:
            return Take(taken=False)
        taking = Taking(wants=wants, holder=Holder("fire", str(row_id)), host=host)
        wait = holds.try_take(tx.conn, taking, now)
        if wait is not None:
            return Take(taken=False, wait=wait)
        return Take(taken=tx.update(row_id, (Status.CLAIMED,), change))

    def limit_tallies(
        self, wants: Wants, *, now: float, host: str | None = None
    ) -> tuple[float, dict[str, Tally]]:
        with self.db.read() as conn:
            return now, holds.tallies(conn, wants, now, host=host, every_group=True)

    def open_rows(self, statuses: Sequence[Status] | None = None) -> list[FireRecord]:
        """Rows that are not done (optionally only these statuses), oldest first."""
        wanted = (
            [s.value for s in statuses]
            if statuses
            else [s.value for s in Status if s is not Status.DONE]
        )
        marks = ", ".join("?" for _ in wanted)
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT * FROM cron_fires WHERE status IN ({marks}) ORDER BY id",  # noqa: S608
                wanted,
            ).fetchall()
        return [FireRecord.from_row(row) for row in rows]

    def get_many(self, row_ids: Sequence[int]) -> list[FireRecord]:
        """The rows with these ids, in the order given (missing ids are left out)."""
        found: dict[int, FireRecord] = {}
        with self.db.read() as conn:
            for start in range(0, len(row_ids), 500):
                chunk = list(row_ids[start : start + 500])
                marks = ", ".join("?" for _ in chunk)
                for row in conn.execute(
                    f"SELECT * FROM cron_fires WHERE id IN ({marks})",  # noqa: S608
                    chunk,
                ):
                    found[row["id"]] = FireRecord.from_row(row)
        return [found[i] for i in row_ids if i in found]

    def count_workers(self) -> int:
        """Cron workers running (or being started) host-wide, across every process."""
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT count(*) FROM cron_fires WHERE status IN ('spawning', 'running')"
            ).fetchone()
        return int(row[0])

    def history(self, job_id: str | None = None, limit: int = 50) -> list[FireRecord]:
        """The newest ``limit`` rows (of one job, or all), newest first."""
        with self.db.read() as conn:
            if job_id is None:
                rows = conn.execute(
                    "SELECT * FROM cron_fires ORDER BY id DESC LIMIT ?", (limit,)
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT * FROM cron_fires WHERE job_id = ? ORDER BY id DESC LIMIT ?",
                    (job_id, limit),
                ).fetchall()
        return [FireRecord.from_row(row) for row in rows]

    def last_rows(self) -> dict[str, FireRecord]:
        """The newest row of every job that has one."""
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM cron_fires WHERE id IN"
                " (SELECT max(id) FROM cron_fires GROUP BY job_id)"
            ).fetchall()
        return {row["job_id"]: FireRecord.from_row(row) for row in rows}

    def prune(self, cutoff: float, *, chunk: int = 1000) -> int:
        """Delete finished rows decided before ``cutoff``, oldest first, keeping the newest row
        of every job (``cron list`` shows it as the last outcome). Returns how many went.

        Rows are walked in id order, which follows decision time, so the work stops at the
        first row that is recent enough instead of scanning the whole table."""
        removed = 0
        with self.db.read() as conn:
            keep = {
                row[0] for row in conn.execute("SELECT max(id) FROM cron_fires GROUP BY job_id")
            }
        after = 0
        while True:
            with self.db.write() as conn:
                rows = conn.execute(
                    "SELECT id, decided_at FROM cron_fires WHERE status = 'done' AND id > ?"
                    " ORDER BY id LIMIT ?",
                    (after, chunk),
                ).fetchall()
                old = [row[0] for row in rows if row[1] < cutoff and row[0] not in keep]
                if old:
                    marks = ", ".join("?" for _ in old)
                    conn.execute(f"DELETE FROM cron_fires WHERE id IN ({marks})", old)  # noqa: S608
                removed += len(old)
            if not rows or rows[-1][1] >= cutoff:
                return removed
            after = rows[-1][0]

    def fire_lags(self) -> list[float]:
        """Seconds from due to started of every scheduled fire that started (retained rows)."""
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT actual - due_at FROM cron_fires WHERE kind = 'schedule'"
                " AND actual IS NOT NULL AND due_at IS NOT NULL"
            ).fetchall()
        return [max(0.0, float(row[0])) for row in rows]

    def outcome_counts(self) -> dict[tuple[str, str], int]:
        """Decided fires by (job id, outcome), over the retained rows."""
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT job_id, outcome, count(*) FROM cron_fires WHERE outcome IS NOT NULL"
                " GROUP BY job_id, outcome"
            ).fetchall()
        return {(str(row[0]), str(row[1])): int(row[2]) for row in rows}

    def retry_counts(self) -> RetryCounts:
        """Retries over the retained rows: each try followed by another (or by a pending
        one), by job and reason, and the fires that had more than one try, by job."""
        counts = RetryCounts()
        with self.db.read() as conn:
            # Only rows with two tries or more, or waiting for the next: the JSON of a fire
            # of one try is never parsed.
            rows = conn.execute(
                "SELECT job_id, status, tries FROM cron_fires WHERE status = 'retry'"
                " OR tries LIKE ?",
                ("%},{%",),  # a bound pattern: the shared SQL holds no literal '%'
            ).fetchall()
        for row in rows:
            tries = load_tries(row[2])
            followed = tries if row[1] == Status.RETRY.value else tries[:-1]
            for tried in followed:
                counts.add(str(row[0]), tried)
            if len(tries) > 1:
                counts.fires[str(row[0])] = counts.fires.get(str(row[0]), 0) + 1
        return counts

    def known_job(self, job_id: str) -> bool:
        """Whether the ledger has any row or state for ``job_id``."""
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT 1 FROM cron_fires WHERE job_id = ? UNION ALL"
                " SELECT 1 FROM cron_jobs WHERE job_id = ? LIMIT 1",
                (job_id, job_id),
            ).fetchone()
        return row is not None


def _job_state(row: sqlite3.Row) -> JobState:
    paused = row["paused"]
    return JobState(
        job_id=row["job_id"],
        watermark=row["watermark"],
        paused=None if paused is None else bool(paused),
        paused_at=row["paused_at"],
        paused_reason=row["paused_reason"],
    )


def _later_watermark(greatest: str) -> str:
    # The watermark only moves forward; an absent one takes the new value.
    return (
        f"watermark = {greatest}(coalesce(cron_jobs.watermark, excluded.watermark),"
        " excluded.watermark)"
    )


@functools.lru_cache(maxsize=4)
def _watermark_sql(greatest: str) -> str:
    return (
        "INSERT INTO cron_jobs (job_id, watermark, updated_at) VALUES (?, ?, ?)"  # noqa: S608
        f" ON CONFLICT(job_id) DO UPDATE SET {_later_watermark(greatest)},"
        " updated_at = excluded.updated_at"
    )


@functools.lru_cache(maxsize=64)
def insert_sql(names: tuple[str, ...]) -> str:
    """``INSERT INTO cron_fires`` of these columns (names checked against the record)."""
    # Column names come from code, never from input; checked once per distinct set.
    for name in names:
        if name not in COLUMNS or name == "id":
            raise ValueError(f"unknown ledger column {name!r}")
    marks = ", ".join("?" for _ in names)
    return f"INSERT INTO cron_fires ({', '.join(names)}) VALUES ({marks})"  # noqa: S608


# Values go to SQLite as they are: StrEnum members bind as text, bools as integers.


RELEASING = (Status.DONE, Status.RETRY)
"""Statuses a fire's row leaves its worker for: its limits are released as it reaches one."""


def _update(
    conn: sqlite3.Connection,
    row_id: int,
    expect: Sequence[Status],
    change: FireChange,
    outbox: Outbox | None = None,
) -> bool:
    values = change.columns()
    for name in values:
        if name not in COLUMNS or name == "id":
            raise ValueError(f"unknown ledger column {name!r}")
    assignments = ", ".join(f"{name} = ?" for name in values)
    marks = ", ".join("?" for _ in expect)
    cursor = conn.execute(
        f"UPDATE cron_fires SET {assignments} WHERE id = ? AND status IN ({marks})",  # noqa: S608
        (*values.values(), row_id, *(s.value for s in expect)),
    )
    changed = cursor.rowcount == 1
    if changed and values.get("status") in RELEASING:
        # A settled fire's named limits (or a try's, before a retry) are free again, in the
        # same transaction; the next try takes them anew.
        holds.release(conn, Holder("fire", str(row_id)), values.get("ended_at") or 0.0)
    if changed and values.get("status") == Status.DONE and outbox is not None:
        # The message commits with the outcome or not at all.
        notices.fires(conn, outbox, [row_id], change.output)
    return changed
