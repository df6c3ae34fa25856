"""Rescue: taking over the work of a host whose lease ran out.

Any live host may rescue any other; the first one wins. One transaction holds the board lock
(every board write is excluded, claims included) and the ledger lock, bumps the dead host's
epoch (compare-and-set on the epoch it read, and only while its lease is still expired), closes
its open runs as ``lost`` (infrastructure: not counted, the cards are ready again) and settles
its cron fires (:meth:`~dispatcher.cluster.ledger.PgLedger.rescue_fires`). So a host is never
rescued twice or half, a host that renewed meanwhile is never rescued, and every later write of
the old host about those runs is fenced out by the new epoch.

A run is rescued only through a lease that expired on the database clock, never because of its
age: a long run of a live host is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.cluster.board import HostStamp, PgBoardStore
from dispatcher.cluster.faults import ClusterFault
from dispatcher.cluster.hosts import Hosts
from dispatcher.cluster.ledger import LEDGER_LOCK, PgLedger
from dispatcher.launch.outbox import Subject


@dataclass(frozen=True, kw_only=True)
class Rescued:
    """What one rescue took over."""

    host_id: str
    epoch: int
    """The dead host's new epoch."""
    runs: tuple[str, ...] = ()
    """Run ids closed ``lost``."""
    fires_lost: tuple[str, ...] = ()
    fires_taken: tuple[str, ...] = ()
    """Claimed fires the rescuing host now runs."""

    def describe(self) -> str:
        """One line for the log."""
        parts = [f"{len(self.runs)} runs closed lost (their cards are ready again)"]
        if self.fires_lost:
            parts.append(f"{len(self.fires_lost)} cron fires lost")
        if self.fires_taken:
            parts.append(f"{len(self.fires_taken)} claimed cron fires taken over")
        return f"host {self.host_id} lost its lease; rescued at epoch {self.epoch}: " + ", ".join(
            parts
        )


class Rescuer:
    """Rescues expired hosts on behalf of ``heir`` (this host)."""

    def __init__(
        self,
        board: PgBoardStore,
        hosts: Hosts,
        heir: HostStamp,
        *,
        heir_claimant: str,
        fault: ClusterFault | None = None,
    ) -> None:
        self.board = board
        self.hosts = hosts
        self.heir = heir
        self.heir_claimant = heir_claimant
        self.fault = fault or ClusterFault()

    def sweep(self, *, now: float) -> list[Rescued]:
        """Rescue every other host that needs it now."""
        done = []
        for host_id, epoch in self.hosts.needing_rescue(self.heir.host_id):
            rescued = self.rescue(host_id, epoch, now=now)
            if rescued is not None:
                done.append(rescued)
        return done

    def rescue(self, host_id: str, epoch: int, *, now: float) -> Rescued | None:
        """Take ``host_id`` over if its lease is still expired at ``epoch`` (None otherwise:
        it renewed, or another host rescued it first)."""
        with self.board.cluster.write() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(?)", (LEDGER_LOCK,))
            new_epoch = self.hosts.take_over(conn, host_id, epoch)
            if new_epoch is None:
                return None
            self.fault.reach("rescue_taken")
            why = f"host {host_id} lost its lease"
            runs = self.board.close_stale(conn, host_id, new_epoch, now, why)
            lost, taken = PgLedger.rescue_fires(
                conn, host_id, now=now, heir=self.heir, heir_claimant=self.heir_claimant
            )
            if self.board.outbox is not None:
                # In the rescue's transaction: the messages commit with the takeover or not.
                lost_at = {"host": host_id, "epoch": new_epoch}
                rescued = lost_at | {"by": self.heir.host_id, "runs": runs}
                rescued |= {"fires_lost": lost, "fires_taken": taken}
                for event, fields in (("host.lost", lost_at), ("host.rescued", rescued)):
                    self.board.outbox.record(conn, event, fields, Subject(), now)
        return Rescued(
            host_id=host_id,
            epoch=new_epoch,
            runs=tuple(runs),
            fires_lost=tuple(lost),
            fires_taken=tuple(taken),
        )
