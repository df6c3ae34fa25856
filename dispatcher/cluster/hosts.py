"""Host leases on the database clock: join, renew, expire, take over.

Each serve in a cluster holds a row in ``hosts``: its boot id, version, an **epoch** and
``lease_until``. Times are the database's (``now()``), never a host's own clock, so a host whose
clock runs wrong cannot keep or break a lease by it. The rules:

* **join**: a host id whose lease is live and whose boot id is another's is refused (two
  machines claiming one id). The same boot id is this host's own serve restarting: it keeps the
  current epoch and adopts its workers (runs another host rescued meanwhile are closed, and their
  workers are now foreign). A new boot id on an expired row (the machine rebooted, or another
  machine took the id over) starts a new epoch: the old epoch's workers died with that boot,
  and the joining host rescues their runs (``Lease.new_epoch``).
* **renew** is fenced by the epoch: it changes nothing when the epoch moved on, which is how a
  host that was partitioned away learns that its runs were rescued (:class:`Superseded`).
* **take over**: another host may bump the epoch of a host whose lease expired, in the same
  transaction that closes that host's open runs as ``lost`` (see
  :meth:`dispatcher.cluster.board.PgBoardStore.rescue`). A run is rescued only then, never on age.
* a host that was superseded rejoins with a new epoch after killing its now-foreign workers.

``shift`` moves the database clock by a number of seconds for tests, so lease expiry is driven
without sleeping; it is always 0 in production.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dispatcher.cluster.database import ClusterDB, ClusterError
from scope.foundation.clock import Clock, SystemClock
from scope.foundation.procstat import boot_time

HOSTS_LOCK = 0x64697370_686F73  # "disp" "hos": joins one at a time


def _on_db_clock(sql: str) -> str:
    # Every {now} is the database clock, shifted by a bound number of seconds (0 but in tests).
    return sql.replace("{now}", "(now() + make_interval(secs => ?))")


_SELECT_FOR_JOIN = _on_db_clock(
    "SELECT boot_id, epoch, lease_until > {now} AS live FROM hosts WHERE host_id = ? FOR UPDATE"
)
_UPSERT = _on_db_clock(
    "INSERT INTO hosts (host_id, boot_id, version, epoch, started_at, heartbeat_at, lease_until)"
    " VALUES (?, ?, ?, 1, {now}, {now}, {now} + make_interval(secs => ?))"
    " ON CONFLICT (host_id) DO UPDATE SET boot_id = excluded.boot_id,"
    " version = excluded.version, started_at = excluded.started_at,"
    " heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until,"
    " epoch = hosts.epoch + ?"
    " RETURNING epoch, extract(epoch FROM lease_until) AS until,"
    " extract(epoch FROM heartbeat_at) AS at"
)
_RENEW = _on_db_clock(
    "UPDATE hosts SET heartbeat_at = {now}, lease_until = {now} + make_interval(secs => ?),"
    " skew = coalesce(?, skew) WHERE host_id = ? AND epoch = ?"
    " RETURNING extract(epoch FROM lease_until) AS until, extract(epoch FROM heartbeat_at) AS at"
)
_EXPIRED = _on_db_clock("SELECT host_id, epoch FROM hosts WHERE lease_until <= {now} ORDER BY 1")
# Expired hosts that still hold work: only those are taken over (an idle dead host's epoch is
# left alone, so an epoch moves only when runs were actually rescued). A server that was down
# stopped every lease from being renewed: nobody's lease counts as expired until a whole TTL
# after the server came back.
_NEEDING_RESCUE = _on_db_clock(
    "SELECT h.host_id, h.epoch FROM hosts h WHERE h.lease_until <= {now} AND h.host_id != ?"
    " AND pg_postmaster_start_time() + make_interval(secs => ?) <= {now}"
    " AND (EXISTS (SELECT 1 FROM kanban_runs r WHERE r.outcome IS NULL AND r.host_id = h.host_id)"
    " OR EXISTS (SELECT 1 FROM cron_fires f WHERE f.status != 'done' AND f.status != 'queued'"
    " AND f.host_id = h.host_id)) ORDER BY 1"
)
_TAKE_OVER = _on_db_clock(
    "UPDATE hosts SET epoch = epoch + 1 WHERE host_id = ? AND epoch = ?"
    " AND lease_until <= {now} RETURNING epoch"
)
_ROWS = _on_db_clock(
    "SELECT host_id, boot_id, version, epoch, skew, extract(epoch FROM heartbeat_at) AS heartbeat,"
    " extract(epoch FROM lease_until) AS until, lease_until > {now} AS live"
    " FROM hosts ORDER BY host_id"
)


BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def host_boot_id(state_dir: Path, boot_id_file: Path = BOOT_ID_FILE) -> str:
    """This host's identity within one boot: the kernel's boot id and the state dir.

    The same serve restarting keeps it (and so its epoch and its workers); a reboot changes it,
    and so does a second state dir on one machine, which is a second host and must not pass
    for the first one's restart."""
    try:
        kernel = boot_id_file.read_text().strip()
    except OSError:
        kernel = ""
    if not kernel:
        # Without the kernel's id, the boot time is as stable within one boot.
        kernel = f"btime-{boot_time() or 0}"
    digest = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:8]
    return f"{kernel}/{digest}"


class Superseded(ClusterError):
    """This host's epoch moved on: another host rescued its runs while it was away."""


class DuplicateHost(ClusterError):
    """Another live machine holds this host id (exit 2: a configuration error)."""

    exit_code = 2


@dataclass(frozen=True, kw_only=True)
class Lease:
    """What a join or renew granted."""

    host_id: str
    epoch: int
    lease_until: float
    """Epoch seconds on the database clock."""
    db_now: float
    """The database clock when the lease was granted."""
    new_epoch: bool = False
    """True when joining started a new epoch: open runs of older epochs need rescue."""


@dataclass(frozen=True, kw_only=True)
class HostRow:
    """One row of ``dispatch hosts``."""

    host_id: str
    boot_id: str
    version: str
    epoch: int
    heartbeat_at: float
    lease_until: float
    live: bool
    skew: float | None


class Hosts:
    """The ``hosts`` table (see the module docstring)."""

    def __init__(
        self, db: ClusterDB, *, lease_ttl: float, shift: Callable[[], float] = lambda: 0.0
    ) -> None:
        self.db = db
        self.lease_ttl = lease_ttl
        self.shift = shift

    def join(self, host_id: str, *, boot_id: str, version: str) -> Lease:
        """Take this host's row (see the rules above); DuplicateHost when another holds it."""
        # One join at a time: two machines joining one new id at once must not both win.
        with self.db.write(HOSTS_LOCK) as conn:
            row = conn.execute(
                _SELECT_FOR_JOIN,
                (self.shift(), host_id),
            ).fetchone()
            if row is not None and row["live"] and row["boot_id"] != boot_id:
                raise DuplicateHost(
                    f"host id {host_id!r} is held by another live machine (boot id "
                    f"{row['boot_id']}); nothing was changed",
                    url=self.db.url,
                    remedy="give this host its own cluster.host_id",
                )
            bump = row is not None and row["boot_id"] != boot_id
            cursor = conn.execute(
                _UPSERT,
                (host_id, boot_id, version, *self._shifts(3), self.lease_ttl, int(bump)),
            )
            got = cursor.fetchone()
        assert got is not None  # an upsert with RETURNING always returns its row
        return Lease(
            host_id=host_id,
            epoch=int(got["epoch"]),
            lease_until=float(got["until"]),
            db_now=float(got["at"]),
            new_epoch=bump,
        )

    def renew(self, host_id: str, epoch: int, *, skew: float | None = None) -> Lease:
        """Extend the lease by ``lease_ttl`` from now; Superseded when the epoch moved on."""
        with self.db.write(None) as conn:
            got = conn.execute(
                _RENEW,
                (*self._shifts(2), self.lease_ttl, skew, host_id, epoch),
            ).fetchone()
        if got is None:
            raise Superseded(
                f"host {host_id} was taken over (epoch {epoch} is no longer current)",
                url=self.db.url,
            )
        return Lease(
            host_id=host_id, epoch=epoch, lease_until=float(got["until"]), db_now=float(got["at"])
        )

    def expired(self) -> list[tuple[str, int]]:
        """(host id, epoch) of every host whose lease has run out."""
        with self.db.read() as conn:
            rows = conn.execute(
                _EXPIRED,
                (self.shift(),),
            ).fetchall()
        return [(str(r["host_id"]), int(r["epoch"])) for r in rows]

    def needing_rescue(self, me: str) -> list[tuple[str, int]]:
        """(host id, epoch) of every other host whose lease ran out while it still had open
        runs or started cron fires."""
        with self.db.read() as conn:
            shift = self.shift()
            rows = conn.execute(_NEEDING_RESCUE, (shift, me, self.lease_ttl, shift)).fetchall()
        return [(str(r["host_id"]), int(r["epoch"])) for r in rows]

    def take_over(self, conn: object, host_id: str, epoch: int) -> int | None:
        """Inside the caller's transaction: bump an expired host's epoch if it is still
        ``epoch`` and still expired. Returns the new epoch, or None (renewed or taken)."""
        row = conn.execute(  # type: ignore[attr-defined]
            _TAKE_OVER,
            (host_id, epoch, self.shift()),
        ).fetchone()
        return None if row is None else int(row["epoch"])

    def row(self, host_id: str) -> HostRow | None:
        """One host's row (None: it never joined)."""
        return next((row for row in self.rows() if row.host_id == host_id), None)

    def rows(self) -> list[HostRow]:
        """Every host, for ``dispatch hosts``."""
        with self.db.read() as conn:
            rows = conn.execute(
                _ROWS,
                (self.shift(),),
            ).fetchall()
        return [
            HostRow(
                host_id=r["host_id"],
                boot_id=r["boot_id"],
                version=r["version"],
                epoch=int(r["epoch"]),
                heartbeat_at=float(r["heartbeat"]),
                lease_until=float(r["until"]),
                live=bool(r["live"]),
                skew=r["skew"],
            )
            for r in rows
        ]

    def measure_skew(self, clock: Clock | None = None) -> float:
        """This host's clock minus the database's, in seconds (request midpoint)."""
        clock = clock or SystemClock()
        before = clock.time()
        with self.db.read() as conn:
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp()) AS t").fetchone()
        after = clock.time()
        return (before + after) / 2 - float(row["t"]) if row is not None else 0.0

    def _shifts(self, count: int) -> tuple[float, ...]:
        value = self.shift()
        return (value,) * count
