"""An in-memory :class:`~dispatcher.cron.abc.LedgerStore` for tests and embedding.

Same contract as the SQLite and PostgreSQL ledgers (the contract suite in ``tests/contracts/``
runs against all three). One lock stands in for the database's single writer: a transaction
holds it and works on a copy of the ledger that replaces the ledger only when the block ends
without an exception, so a tick's decisions commit together or not at all. Rows are kept as
their stored column values and handed out as :class:`~dispatcher.cron.records.FireRecord`, as
the SQL ledgers do. Nothing survives the process: use it for tests of scheduling policies,
never as a ledger of record.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dispatcher.buckets import Bucket, Window
from dispatcher.cron import history
from dispatcher.cron.abc import LedgerStore, LedgerTx, Take
from dispatcher.cron.records import COLUMNS, EMPTY_ROW, FireRecord, JobState, Status
from dispatcher.launch.holds import Holder, MemoryHolds, Taking
from dispatcher.launch.limits import Tally, Wants

if TYPE_CHECKING:
    from dispatcher.cron.changes import FireChange

__all__ = ["MemoryLedger"]

_WORKING = (Status.SPAWNING.value, Status.RUNNING.value)


@dataclass
class _Book:
    """The whole ledger: rows by id (stored values), the fire-key index, job states."""

    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    keys: dict[str, int] = field(default_factory=dict)
    jobs: dict[str, JobState] = field(default_factory=dict)
    last_id: int = 0
    settled: list[int] = field(default_factory=list)
    """Rows this copy moved to ``done``: their limit holds are released when it commits."""

    def copy(self) -> _Book:
        return _Book(
            rows={i: dict(r) for i, r in self.rows.items()},
            keys=dict(self.keys),
            jobs=dict(self.jobs),
            last_id=self.last_id,
        )

    def record(self, row_id: int) -> FireRecord:
        return FireRecord.from_row(self.rows[row_id])

    def open_ids(self, statuses: Sequence[str] | None = None) -> list[int]:
        wanted = statuses or [s.value for s in Status if s is not Status.DONE]
        return sorted(i for i, r in self.rows.items() if r["status"] in wanted)

    def insert(self, values: dict[str, Any]) -> int | None:
        for name in values:
            if name not in COLUMNS or name == "id":
                raise ValueError(f"unknown ledger column {name!r}")
        if values["fire_key"] in self.keys:
            return None
        self.last_id += 1
        row = {**EMPTY_ROW, **_stored(values), "id": self.last_id}
        self.rows[self.last_id] = row
        self.keys[row["fire_key"]] = self.last_id
        return self.last_id

    def update(self, row_id: int, expect: Sequence[Status], change: FireChange) -> bool:
        values = change.columns()
        row = self.rows.get(row_id)
        if row is None or row["status"] not in {s.value for s in expect}:
            return False
        row.update(values)
        if values.get("status") in (Status.DONE.value, Status.RETRY.value):
            self.settled.append(row_id)
        return True

    def set_paused(self, job_id: str, paused: bool, now: float, reason: str | None) -> bool:
        current = self.jobs.get(job_id) or JobState(
            job_id=job_id, watermark=None, paused=None, paused_at=None
        )
        if current.paused is paused:
            return False
        if paused:
            self.jobs[job_id] = replace(current, paused=True, paused_at=now, paused_reason=reason)
        else:
            mark = now if current.watermark is None else max(current.watermark, now)
            self.jobs[job_id] = replace(
                current, paused=False, paused_at=None, paused_reason=None, watermark=mark
            )
        return True

    def defer(
        self, fire_key: str, session_id: str | None, until: float, reason: str | None
    ) -> bool:
        row = self.rows.get(self.keys.get(fire_key, 0))
        if row is None or row["status"] not in _WORKING or row["attempts"] is None:
            return False
        if row["session_id"] not in (None, session_id):
            return False
        row.update(retry_at=until, retry_kind="deferred", retry_reason=reason)
        return True

    def later_watermark(self, job_id: str, watermark: float) -> None:
        current = self.jobs.get(job_id) or JobState(
            job_id=job_id, watermark=None, paused=None, paused_at=None
        )
        mark = watermark if current.watermark is None else max(current.watermark, watermark)
        self.jobs[job_id] = replace(current, watermark=mark)


def _stored(values: dict[str, Any]) -> dict[str, Any]:
    # As SQLite binds them: enum members as their text, booleans as 0/1.
    out: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, enum.Enum):
            value = value.value
        out[name] = value
    return out


class MemoryTx(LedgerTx):
    """The operations of one transaction, on the transaction's copy of the ledger."""

    def __init__(self, book: _Book) -> None:
        self.book = book

    def job_states(self, job_ids: Sequence[str] | None = None) -> dict[str, JobState]:
        jobs = self.book.jobs
        return {j: s for j, s in jobs.items() if job_ids is None or j in job_ids}

    def all_open_rows(self) -> list[FireRecord]:
        return [self.book.record(i) for i in self.book.open_ids()]

    def open_rows(self, job_id: str) -> list[FireRecord]:
        return [r for r in self.all_open_rows() if r.job_id == job_id]

    def set_watermark(self, job_id: str, watermark: float, now: float) -> None:
        self.book.later_watermark(job_id, watermark)

    def set_watermarks(self, job_ids: Sequence[str], watermark: float) -> None:
        for job_id in job_ids:
            self.book.later_watermark(job_id, watermark)

    def existing_keys(self, keys: Sequence[str]) -> set[str]:
        return {key for key in keys if key in self.book.keys}

    def insert_many(self, rows: Sequence[dict[str, Any]]) -> list[int]:
        ids = []
        for row in rows:
            row_id = self.book.insert(dict(row))
            if row_id is None:
                raise ValueError(f"fire key {row['fire_key']!r} is already in the ledger")
            ids.append(row_id)
        return ids

    def insert(self, **values: Any) -> int | None:
        return self.book.insert(values)

    def update(self, row_id: int, expect: Sequence[Status], change: FireChange) -> bool:
        return self.book.update(row_id, expect, change)

    def set_paused(self, job_id: str, paused: bool, now: float, reason: str | None = None) -> bool:
        return self.book.set_paused(job_id, paused, now, reason)


class MemoryLedger(LedgerStore):
    """The cron ledger in memory, guarded by one lock (see the module docstring)."""

    def __init__(self, holds: MemoryHolds | None = None) -> None:
        self._lock = threading.RLock()
        self._book = _Book()
        self.holds = holds or MemoryHolds()
        """The named limits' holds (share one with a memory board to share the limits)."""

    @contextlib.contextmanager
    def transaction(self) -> Iterator[MemoryTx]:
        with self._lock:
            work = self._book.copy()
            yield MemoryTx(work)
            self._commit(work)

    def _commit(self, book: _Book) -> None:
        """Make ``book`` the ledger, releasing the holds of the rows it settled."""
        self._book = book
        for row_id in book.settled:
            self.holds.release(Holder("fire", str(row_id)), book.rows[row_id]["ended_at"] or 0.0)
        book.settled.clear()

    def take(self, row_id: int, change: FireChange, wants: Wants, *, now: float) -> Take:
        with self._lock:
            row = self._book.rows.get(row_id)
            if row is None or row["status"] != Status.CLAIMED.value:
                return Take(taken=False)
            taking = Taking(wants=wants, holder=Holder("fire", str(row_id)))
            wait = self.holds.try_take(taking, now)
            if wait is not None:
                return Take(taken=False, wait=wait)
            return Take(taken=self.update(row_id, (Status.CLAIMED,), change))

    def limit_tallies(
        self, wants: Wants, *, now: float, host: str | None = None
    ) -> tuple[float, dict[str, Tally]]:
        return now, self.holds.tallies(wants, now, host=host, every_group=True)

    def job_states(self) -> dict[str, JobState]:
        with self._lock:
            return dict(self._book.jobs)

    def set_paused(self, job_id: str, paused: bool, now: float, reason: str | None = None) -> bool:
        with self.transaction() as tx:
            return tx.set_paused(job_id, paused, now, reason)

    def defer(
        self, fire_key: str, *, session_id: str | None, until: float, reason: str | None
    ) -> bool:
        with self._lock:
            return self._book.defer(fire_key, session_id, until, reason)

    def get(self, row_id: int) -> FireRecord:
        with self._lock:
            if row_id not in self._book.rows:
                raise KeyError(row_id)
            return self._book.record(row_id)

    def get_many(self, row_ids: Sequence[int]) -> list[FireRecord]:
        with self._lock:
            return [self._book.record(i) for i in row_ids if i in self._book.rows]

    def by_key(self, fire_key: str) -> FireRecord | None:
        with self._lock:
            row_id = self._book.keys.get(fire_key)
            return None if row_id is None else self._book.record(row_id)

    def update(self, row_id: int, expect: Sequence[Status], change: FireChange) -> bool:
        with self._lock:
            changed = self._book.update(row_id, expect, change)
            self._commit(self._book)
            return changed

    def open_rows(self, statuses: Sequence[Status] | None = None) -> list[FireRecord]:
        wanted = [s.value for s in statuses] if statuses else None
        with self._lock:
            return [self._book.record(i) for i in self._book.open_ids(wanted)]

    def count_workers(self) -> int:
        with self._lock:
            return sum(1 for r in self._book.rows.values() if r["status"] in _WORKING)

    def history(self, job_id: str | None = None, limit: int = 50) -> list[FireRecord]:
        with self._lock:
            rows = self._book.rows
            ids = [i for i in sorted(rows, reverse=True) if job_id in (None, rows[i]["job_id"])]
            return [self._book.record(i) for i in ids[: max(0, limit)]]

    def last_rows(self) -> dict[str, FireRecord]:
        with self._lock:
            newest: dict[str, int] = {}
            for row_id, row in sorted(self._book.rows.items()):
                newest[row["job_id"]] = row_id
            return {job: self._book.record(i) for job, i in newest.items()}

    def prune(self, cutoff: float, *, chunk: int = 1000) -> int:
        with self._lock:
            book = self._book
            keep = {r.id for r in self.last_rows().values()}
            old = [
                i
                for i, r in book.rows.items()
                if r["status"] == Status.DONE.value and r["decided_at"] < cutoff and i not in keep
            ]
            for row_id in old:
                del book.keys[book.rows.pop(row_id)["fire_key"]]
            return len(old)

    def known_job(self, job_id: str) -> bool:
        with self._lock:
            book = self._book
            return job_id in book.jobs or any(r["job_id"] == job_id for r in book.rows.values())

    def _records(self) -> list[FireRecord]:
        with self._lock:
            return [self._book.record(i) for i in sorted(self._book.rows)]

    def fire_buckets(self, window: Window, *, job_id: str | None = None) -> list[Bucket]:
        return history.fire_buckets(window, self._records(), job_id)

    def roll_up(self, now: float, *, spans: int = 12) -> int:
        return 0

    def fires_in(
        self,
        start: float,
        end: float,
        *,
        job_id: str | None = None,
        outcome: str | None = None,
        limit: int = 500,
    ) -> list[FireRecord]:
        return history.fires_in(
            self._records(), start, end, job_id=job_id, outcome=outcome, limit=limit
        )
