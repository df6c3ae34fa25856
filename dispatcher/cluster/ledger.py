"""The cron ledger in the cluster database: :class:`PgLedger`.

The ledger's SQL is the SQLite ledger's (:class:`dispatcher.cron.ledger.Ledger`). What differs:

* a failed ``INSERT`` aborts a PostgreSQL transaction, so a fire key that is already taken is
  skipped with ``ON CONFLICT DO NOTHING`` instead of caught; a tick's transaction holds the
  ledger's advisory lock, as SQLite's single writer does, so the keys a tick found free are
  still free when it inserts them. Any host may try any fire; the unique fire key decides which
  one runs it, and the others see ``None``. The watermark is shared, so catch-up after an
  outage of the whole cluster is decided once, by whichever host ticks first;
* a ledger stamped for a host (:class:`~dispatcher.cluster.board.HostStamp`) writes its host id
  on every row it decides or takes, and sees only its own claimed, starting and running rows
  (plus every queued one and every fire waiting for its next try) in
  :meth:`PgLedger.open_rows`: those are the rows whose sessions its registry knows, and a
  waiting row is started by whichever host takes it first (compare-and-set), so a retry
  outlives the host that ran the failed try. ``cron.max_concurrent`` counts this host's
  workers;
* :meth:`PgLedger.rescue_fires` settles a dead host's fires inside a rescue: started ones are
  ``lost`` (infrastructure), claimed ones that never started pass to the rescuing host, which
  runs them (a fire is missed only while no host is up).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dispatcher.cluster.board import HostStamp
from dispatcher.cluster.database import BUDGET_LOCK, ClusterDB, Qmark, database_clock
from dispatcher.cron.abc import Take
from dispatcher.cron.changes import UNSET, FireChange
from dispatcher.cron.ledger import Ledger, Tx, insert_sql
from dispatcher.cron.records import FireRecord, Status
from dispatcher.launch import holds
from dispatcher.launch.limits import Tally, Wants

LEDGER_LOCK = 0x64697370_6C6467  # "disp" "ldg": one ledger writer at a time
_SHARED = (Status.QUEUED, Status.RETRY)
"""Waiting rows any host may start (no worker of them runs anywhere)."""


class PgTx(Tx):
    """A ledger transaction on PostgreSQL (stamps this host on the rows it decides or takes)."""

    stamp: HostStamp | None = None

    def insert(self, **values: Any) -> int | None:
        values = _flags(values)
        sql = insert_sql(tuple(values)) + " ON CONFLICT DO NOTHING RETURNING id"
        row = self.conn.execute(sql, tuple(values.values())).fetchone()
        if row is None:
            return None
        self._own([int(row[0])])
        self.notify_new([int(row[0])])
        return int(row[0])

    def insert_many(self, rows: Sequence[dict[str, Any]]) -> list[int]:
        ids = super().insert_many([_flags(row) for row in rows])
        self._own(ids)
        return ids

    def update(self, row_id: int, expect: Sequence[Status], change: FireChange) -> bool:
        done = super().update(row_id, expect, change)
        if done and change.claimant is not UNSET:
            self._own([row_id])
        return done

    def _own(self, ids: Sequence[int]) -> None:
        if self.stamp is not None and ids:
            self.conn.execute(
                "UPDATE cron_fires SET host_id = ? WHERE id = ANY(?)",
                (self.stamp.host_id, list(ids)),
            )


def _flags(values: dict[str, Any]) -> dict[str, Any]:
    # Flags are 0/1 integers in both schemas; SQLite takes a bool for one, PostgreSQL does not.
    return {k: int(v) if isinstance(v, bool) else v for k, v in values.items()}


class _LedgerDB:
    """The cluster database as the ledger uses it: writes take the ledger's lock."""

    def __init__(self, cluster: ClusterDB) -> None:
        self.cluster = cluster

    def read(self) -> contextlib.AbstractContextManager[Qmark]:
        return self.cluster.read()

    @contextlib.contextmanager
    def write(self) -> Iterator[Qmark]:
        with self.cluster.write(LEDGER_LOCK) as conn:
            yield conn


class PgLedger(Ledger):
    """Fire decisions and job state shared by every host of a cluster."""

    TX = PgTx
    GREATEST = "GREATEST"

    def __init__(
        self,
        db: ClusterDB,
        stamp: HostStamp | None = None,
        *,
        shift: Callable[[], float] = lambda: 0.0,
    ) -> None:
        super().__init__(_LedgerDB(db))
        self.stamp = stamp
        self.shift = shift
        """Moves the database clock the named limits see (tests only)."""

    def take(self, row_id: int, change: FireChange, wants: Wants, *, now: float) -> Take:
        """See :meth:`LedgerStore.take`: under the board's budget lock (which every kanban
        claim takes too, after the ledger's lock here), on the database's clock."""
        with self.transaction() as tx:
            clock = now
            if wants:
                tx.conn.execute("SELECT pg_advisory_xact_lock(?)", (BUDGET_LOCK,))
                clock = database_clock(tx.conn) + self.shift()
            host = None if self.stamp is None else self.stamp.host_id
            return self._take(tx, row_id, change, wants, clock, host=host)

    def limit_tallies(
        self, wants: Wants, *, now: float, host: str | None = None
    ) -> tuple[float, dict[str, Tally]]:
        with self.db.read() as conn:
            clock = database_clock(conn) + self.shift()
            return clock, holds.tallies(conn, wants, clock, host=host, every_group=True)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Tx]:
        with super().transaction() as tx:
            if isinstance(tx, PgTx):
                tx.stamp = self.stamp
            yield tx

    def update(self, row_id: int, expect: Sequence[Status], change: FireChange) -> bool:
        with self.transaction() as tx:
            return tx.update(row_id, expect, change)

    def open_rows(self, statuses: Sequence[Status] | None = None) -> list[FireRecord]:
        rows = super().open_rows(statuses)
        if self.stamp is None or not rows:
            return rows
        with self.db.read() as conn:
            mine = {
                int(r[0])
                for r in conn.execute(
                    "SELECT id FROM cron_fires WHERE id = ANY(?) AND host_id = ?",
                    ([r.id for r in rows], self.stamp.host_id),
                )
            }
        return [r for r in rows if r.status in _SHARED or r.id in mine]

    def fire_hosts(self, row_ids: Sequence[int]) -> dict[int, str | None]:
        """The host that decided or ran each of these fires (``cron history``)."""
        if not row_ids:
            return {}
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT id, host_id FROM cron_fires WHERE id = ANY(?)", (list(row_ids),)
            ).fetchall()
        return {int(row[0]): row[1] for row in rows}

    def count_workers(self) -> int:
        if self.stamp is None:
            return super().count_workers()
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT count(*) FROM cron_fires WHERE status IN ('spawning', 'running')"
                " AND host_id = ?",
                (self.stamp.host_id,),
            ).fetchone()
        return int(row[0])

    def foreign_fires(self, fire_keys: list[str]) -> set[str]:
        """Which of these fires this host must not run on: settled (rescued as lost, or
        replaced by a newer fire, possibly decided on another host) or another host's."""
        if self.stamp is None or not fire_keys:
            return set()
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT fire_key FROM cron_fires WHERE fire_key = ANY(?)"
                " AND (status = 'done' OR host_id IS DISTINCT FROM ?)",
                (fire_keys, self.stamp.host_id),
            ).fetchall()
        return {row[0] for row in rows}

    @staticmethod
    def rescue_fires(
        conn: Qmark, host_id: str, *, now: float, heir: HostStamp, heir_claimant: str
    ) -> tuple[list[str], list[str]]:
        """Inside a rescue's transaction (holding the ledger lock): a dead host's started
        fires become ``lost``; its claimed, never started ones pass to ``heir``. Returns the
        fire keys (lost, taken over)."""
        lost = conn.execute(
            "UPDATE cron_fires SET status = 'done', outcome = 'lost', infrastructure = 1,"
            " ended_at = ?, error = ? WHERE host_id = ? AND status IN ('spawning', 'running')"
            " RETURNING fire_key, id",
            (now, f"host {host_id} lost its lease while the fire ran", host_id),
        ).fetchall()
        for row in lost:
            holds.release(conn, holds.Holder("fire", str(row[1])), now)
        taken = conn.execute(
            "UPDATE cron_fires SET host_id = ?, claimant = ? WHERE host_id = ?"
            " AND status = 'claimed' RETURNING fire_key",
            (heir.host_id, heir_claimant, host_id),
        ).fetchall()
        return [str(r[0]) for r in lost], [str(r[0]) for r in taken]
