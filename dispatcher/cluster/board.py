"""The board in the cluster database: :class:`PgBoardStore`.

The board's SQL is the SQLite store's (:class:`dispatcher.kanban.store.SqlBoardStore`), run
through :class:`~dispatcher.cluster.database.ClusterDB`, whose write transactions hold the
board's advisory lock; this module adds what only a cluster has:

* every run is stamped with the claiming host and its lease epoch (:class:`HostStamp`);
* every write about a run is **fenced**: it changes nothing unless the run's epoch is still its
  host's current epoch (and, for a host's own writes, the run is this host's at this epoch);
* the per-host budget (``kanban.max_in_progress_per_host``) counts this host's open runs;
* :meth:`PgBoardStore.rescue` closes the open runs of a host whose lease expired as ``lost``
  (infrastructure: never counted against the card) and returns their cards to ready, in the same
  transaction that bumps that host's epoch, so a host can never be rescued twice or half.
"""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.cluster.database import ClusterDB
from dispatcher.cluster.hosts import Hosts
from dispatcher.cluster.wake import CHANNEL
from dispatcher.kanban.sql import SqlConnection
from dispatcher.kanban.store import SqlBoardStore
from dispatcher.kanban.taxonomy import Breaker, after_run
from dispatcher.launch.outcome import Outcome, Result


@dataclass(kw_only=True)
class HostStamp:
    """Which host writes, and under which epoch (updated when the host rejoins)."""

    host_id: str
    epoch: int


class PgBoardStore(SqlBoardStore):
    """Cards, runs and events shared by every host of a cluster."""

    PARENT_ORDER = "position"
    PREFIX_MATCH = "starts_with({column}, ?)"

    def __init__(self, db: ClusterDB, stamp: HostStamp | None = None) -> None:
        super().__init__(db)
        self.stamp = stamp

    @staticmethod
    def _bump(conn: SqlConnection) -> None:
        SqlBoardStore._bump(conn)
        # Delivered to every listening host when this transaction commits (never before).
        conn.execute("SELECT pg_notify(?, '')", (CHANNEL,))

    def _stamp(self, conn: SqlConnection, run_id: str) -> None:
        if self.stamp is not None:
            conn.execute(
                "UPDATE kanban_runs SET host_id = ?, epoch = ? WHERE run_id = ?",
                (self.stamp.host_id, self.stamp.epoch, run_id),
            )

    def _fenced(self, conn: SqlConnection, run_id: str) -> bool:
        row = conn.execute(
            "SELECT r.host_id, r.epoch, h.epoch AS current FROM kanban_runs r"
            " LEFT JOIN hosts h ON h.host_id = r.host_id WHERE r.run_id = ?",
            (run_id,),
        ).fetchone()
        if row is None or row["host_id"] is None:
            return row is not None
        if row["current"] != row["epoch"]:
            return False
        mine = self.stamp
        return mine is None or (mine.host_id, mine.epoch) == (row["host_id"], row["epoch"])

    def _host_open_count(self, conn: SqlConnection) -> int | None:
        if self.stamp is None:
            return None
        row = conn.execute(
            "SELECT COUNT(*) FROM kanban_runs WHERE outcome IS NULL AND host_id = ?",
            (self.stamp.host_id,),
        ).fetchone()
        return int(row[0])

    def rescue(self, hosts: Hosts, host_id: str, epoch: int, *, now: float) -> list[str]:
        """Take over ``host_id`` (lease expired, epoch still ``epoch``) and close its open runs
        as ``lost``; returns their run ids ([] when it renewed or was taken over meanwhile)."""
        with self.db.write() as conn:
            new_epoch = hosts.take_over(conn, host_id, epoch)
            if new_epoch is None:
                return []
            return self._close_stale(
                conn, host_id, new_epoch, now, f"host {host_id} lost its lease"
            )

    def rescue_stale(self, host_id: str, epoch: int, *, now: float) -> list[str]:
        """Close this host's open runs from epochs before ``epoch`` (after a join started a new
        epoch: the machine rebooted, so those workers are gone)."""
        with self.db.write() as conn:
            return self._close_stale(conn, host_id, epoch, now, f"host {host_id} restarted")

    def _close_stale(
        self, conn: SqlConnection, host_id: str, epoch: int, now: float, why: str
    ) -> list[str]:
        rows = conn.execute(
            "SELECT run_id FROM kanban_runs WHERE outcome IS NULL AND host_id = ? AND epoch < ?"
            " ORDER BY claimed_at",
            (host_id, epoch),
        ).fetchall()
        result = Result(outcome=Outcome.LOST, infrastructure=True, error=why)
        closed = []
        for row in rows:
            done = self._close(
                conn,
                row["run_id"],
                result,
                lambda card, run: after_run(card, run, result, Breaker(), now),
                now,
                fence=False,
            )
            if done is not None:
                closed.append(row["run_id"])
        return closed
