"""The cron ledger's contract: one row per fire decision, and per-job scheduling state.

What every ledger backend promises, checked by ``tests/contracts/test_ledger.py`` over each of
them (in memory :class:`dispatcher.cron.memory.MemoryLedger`, SQLite
:class:`dispatcher.cron.ledger.Ledger`, PostgreSQL :class:`dispatcher.cluster.ledger.PgLedger`
for cluster mode):

* a fire key is unique: inserting a row whose key is already present inserts nothing and says
  so (``None``), so any number of schedulers may try the same fire and exactly one owns it;
* every change of a row's status is a compare-and-set on the status it is expected to have;
* a job's watermark only moves forward; resuming a paused job moves it to the resume time and
  clears why it was paused;
* a worker's deferral lands only on its own try while that try is starting or running;
* a transaction (:meth:`LedgerStore.transaction`) commits every decision of a tick together, or
  none of them;
* a fire takes the named limits its job ``uses`` in the compare-and-set that starts it, all or
  none (:meth:`LedgerStore.take`), and releases them in the one that settles it: a cron fire
  and a kanban run using one limit share it.

The records (:class:`~dispatcher.cron.records.FireRecord`,
:class:`~dispatcher.cron.records.JobState`) and the row status enum are
:mod:`dispatcher.cron.records`, which the contract and every backend import.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dispatcher.buckets import Bucket, Window
from dispatcher.cron.records import FireRecord, JobState, Status
from dispatcher.launch.limits import LimitWait, Tally, Wants

if TYPE_CHECKING:
    from dispatcher.cron.changes import FireChange
    from dispatcher.launch.outbox import Outbox


@dataclass(frozen=True, kw_only=True)
class Take:
    """What :meth:`LedgerStore.take` did: ``taken`` (the row moved on), or not because it is
    no longer claimed, or because a named limit is full (``wait`` says which)."""

    taken: bool
    wait: LimitWait | None = None


class LedgerTx(abc.ABC):
    """The operations of one write transaction (see :meth:`LedgerStore.transaction`)."""

    @abc.abstractmethod
    def job_states(self, job_ids: Sequence[str] | None = None) -> dict[str, JobState]:
        """The state rows of ``job_ids`` (all when None)."""

    @abc.abstractmethod
    def all_open_rows(self) -> list[FireRecord]:
        """Every row that is not done, oldest first."""

    @abc.abstractmethod
    def open_rows(self, job_id: str) -> list[FireRecord]:
        """The job's rows that are not done, oldest first."""

    @abc.abstractmethod
    def set_watermark(self, job_id: str, watermark: float, now: float) -> None:
        """Move the job's watermark forward (never back)."""

    @abc.abstractmethod
    def set_watermarks(self, job_ids: Sequence[str], watermark: float) -> None:
        """Move several jobs' watermarks forward to ``watermark`` (never back)."""

    @abc.abstractmethod
    def existing_keys(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are already in the ledger."""

    @abc.abstractmethod
    def insert_many(self, rows: Sequence[dict[str, Any]]) -> list[int]:
        """Insert rows whose keys this transaction checked to be new; their ids in order."""

    @abc.abstractmethod
    def insert(self, **values: Any) -> int | None:
        """Insert a row; None (nothing changed) when its fire key is already in the ledger."""

    @abc.abstractmethod
    def update(self, row_id: int, expect: Sequence[Status], change: FireChange) -> bool:
        """Compare-and-set: apply ``change`` only if the row's status is one of ``expect``."""

    @abc.abstractmethod
    def set_paused(self, job_id: str, paused: bool, now: float, reason: str | None = None) -> bool:
        """Pause (with ``reason`` when dispatch pauses the job itself) or resume; False when
        the job already was in that state. Resuming clears the reason and moves the watermark
        to ``now`` so fires that fell in the pause are neither run nor missed."""


class LedgerStore(abc.ABC):
    """Reads and writes the cron ledger (see the module docstring)."""

    outbox: Outbox | None = None
    """Where settled fires and pauses queue their notifications in their own transaction
    (None: nowhere; the memory ledger never queues any)."""

    @abc.abstractmethod
    def transaction(self) -> AbstractContextManager[LedgerTx]:
        """One write transaction: every decision of a tick commits (or not) together."""

    @abc.abstractmethod
    def job_states(self) -> dict[str, JobState]:
        """Every job's state row."""

    @abc.abstractmethod
    def set_paused(self, job_id: str, paused: bool, now: float, reason: str | None = None) -> bool:
        """:meth:`LedgerTx.set_paused` in its own transaction."""

    @abc.abstractmethod
    def defer(
        self, fire_key: str, *, session_id: str | None, until: float, reason: str | None
    ) -> bool:
        """The worker of a fire's try chooses when the next try starts: store ``until`` (and
        ``reason``) on the fire, only while a try is starting or running whose session is
        ``session_id`` (or not recorded yet) and only on a fire with a retry policy. False
        when no such try is in progress (nothing changed)."""

    @abc.abstractmethod
    def get(self, row_id: int) -> FireRecord:
        """The row with this id (KeyError when absent)."""

    @abc.abstractmethod
    def get_many(self, row_ids: Sequence[int]) -> list[FireRecord]:
        """The rows with these ids, in the order given (missing ids are left out)."""

    @abc.abstractmethod
    def by_key(self, fire_key: str) -> FireRecord | None:
        """The row with this fire key, if any."""

    @abc.abstractmethod
    def update(self, row_id: int, expect: Sequence[Status], change: FireChange) -> bool:
        """Compare-and-set on the status, in its own transaction."""

    @abc.abstractmethod
    def take(self, row_id: int, change: FireChange, wants: Wants, *, now: float) -> Take:
        """Move a ``claimed`` row on with ``change`` (compare-and-set), taking every limit of
        ``wants`` for it in the same transaction, all or none: not taken, changing nothing,
        when the row is no longer claimed or a limit is full (with the wait). Limits count
        on the ledger's clock: ``now`` on one host, the database's in a cluster. A row that
        reaches ``done`` by any update releases what it took."""

    @abc.abstractmethod
    def limit_tallies(
        self, wants: Wants, *, now: float, host: str | None = None
    ) -> tuple[float, dict[str, Tally]]:
        """What the holds of ``wants`` say now, and the time they were read at (as
        :meth:`dispatcher.kanban.abc.BoardStore.limit_tallies`)."""

    @abc.abstractmethod
    def open_rows(self, statuses: Sequence[Status] | None = None) -> list[FireRecord]:
        """Rows that are not done (optionally only these statuses), oldest first."""

    @abc.abstractmethod
    def count_workers(self) -> int:
        """Cron workers running or being started, across every process on the ledger."""

    @abc.abstractmethod
    def history(self, job_id: str | None = None, limit: int = 50) -> list[FireRecord]:
        """The newest ``limit`` rows (of one job, or all), newest first."""

    @abc.abstractmethod
    def last_rows(self) -> dict[str, FireRecord]:
        """The newest row of every job that has one."""

    @abc.abstractmethod
    def prune(self, cutoff: float, *, chunk: int = 1000) -> int:
        """Delete finished rows decided before ``cutoff``, keeping every job's newest row."""

    @abc.abstractmethod
    def known_job(self, job_id: str) -> bool:
        """Whether the ledger has any row or state for ``job_id``."""

    # -- history (the web's charts and timeline) ---------------------------------------------

    @abc.abstractmethod
    def fire_buckets(self, window: Window, *, job_id: str | None = None) -> list[Bucket]:
        """Per bucket of ``window``, the settled fires (of ``job_id``) counted when they
        settled (:func:`dispatcher.cron.history.fire_time`): counts by outcome, and the spreads
        ``lag`` (due to start of scheduled fires) and ``run`` (start to end). Index ranges on
        the end and decision times, never a walk of the ledger."""

    @abc.abstractmethod
    def roll_up(self, now: float, *, spans: int = 12) -> int:
        """Store the answers of settled buckets of :data:`dispatcher.rollup.STEPS` that have
        none yet, as :meth:`dispatcher.kanban.abc.BoardStore.roll_up` does for the board: it
        never changes what :meth:`fire_buckets` answers; how many were stored (0: current; a
        ledger in memory keeps nothing)."""

    @abc.abstractmethod
    def fires_in(
        self,
        start: float,
        end: float,
        *,
        job_id: str | None = None,
        outcome: str | None = None,
        limit: int = 500,
    ) -> list[FireRecord]:
        """At most ``limit`` settled fires whose time is in ``[start, end)``, by that time."""
