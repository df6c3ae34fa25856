"""``dispatch state migrate --to URL``: move a single host's board and ledger into a cluster.

Copies the cluster state of the host's SQLite database (cards with their groups, parents, runs,
events, the board flags, cron fires and job state, pause state included, the notification
outbox, the API tokens, and the named limits' holds, so a rate window goes on counting) into an
**empty** cluster database, in one PostgreSQL transaction: on any error nothing is written, and
a database that already holds a board or a ledger is refused untouched. Ids, event sequence
numbers and fire ids are kept, so history reads the same afterwards. Host state (sessions,
logs, exit records) stays where it is. Work in flight does not move: while a run is open or a
fire started, the copy is refused (those workers report to this host's SQLite board; in the
cluster they would belong to no lease).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dispatcher.cluster.database import BOARD_LOCK, ClusterDB, ClusterError, Qmark
from dispatcher.cluster.ledger import LEDGER_LOCK
from dispatcher.errors import DispatcherError
from registry.store.database import StateDB

# (table, ORDER BY, identity column kept with OVERRIDING SYSTEM VALUE)
TABLES: Sequence[tuple[str, str, str | None]] = (
    ("kanban_cards", "created_at, id", None),
    ("kanban_parents", "rowid", None),
    ("kanban_runs", "claimed_at, run_id", None),
    ("kanban_events", "seq", "seq"),
    ("cron_fires", "id", "id"),
    ("cron_jobs", "job_id", None),
    ("notify_outbox", "created_at, message_id, channel", None),
    ("web_tokens", "created_at, id", None),
    ("limit_holds", "id", "id"),
)
_CHUNK = 1000


@dataclass(frozen=True, kw_only=True)
class Migrated:
    """What was copied: rows per table, and the board flags."""

    counts: dict[str, int]
    paused: bool
    board_version: int


class InFlight(DispatcherError):
    """The single host still has open runs or started fires: their workers belong to it."""

    def __init__(self, runs: int, fires: int) -> None:
        super().__init__(
            remedy="pause the board (dispatch kanban pause), let the workers finish "
            "(dispatch ps), stop dispatch serve, then migrate",
            runs=runs,
            fires=fires,
        )

    def describe(self) -> str:
        return (
            f"{self.fields['runs']} kanban runs and {self.fields['fires']} cron fires are still "
            "open on this host; nothing was copied"
        )


def migrate(source: StateDB, target: ClusterDB) -> Migrated:
    """Copy ``source``'s cluster state into ``target`` (see the module docstring)."""
    _refuse_in_flight(source)
    target.migrate()
    counts: dict[str, int] = {}
    try:
        with source.read() as src, target.write(BOARD_LOCK) as dst:
            dst.execute("SELECT pg_advisory_xact_lock(?)", (LEDGER_LOCK,))
            _refuse_non_empty(dst, target)
            for table, order, identity in TABLES:
                counts[table] = _copy(src, dst, table, order, identity)
            meta = {r[0]: int(r[1]) for r in src.execute("SELECT key, value FROM kanban_meta")}
            for key, value in meta.items():
                dst.execute("UPDATE kanban_meta SET value = ? WHERE key = ?", (value, key))
    except ClusterError as err:
        if "nothing was" in err.fields["problem"]:
            raise
        raise ClusterError(
            f"copy failed, nothing was written: {err.fields['problem']}", url=target.url
        ) from err
    return Migrated(
        counts=counts,
        paused=bool(meta.get("paused", 0)),
        board_version=meta.get("board_version", 0),
    )


def _refuse_in_flight(source: StateDB) -> None:
    # Open runs and started fires have workers on this host, whose ends this host records; in
    # the cluster they would belong to no lease. Finished history moves; work in flight not.
    with source.read() as src:
        runs = src.execute("SELECT count(*) FROM kanban_runs WHERE outcome IS NULL").fetchone()
        fires = src.execute(
            "SELECT count(*) FROM cron_fires WHERE status IN ('claimed', 'spawning', 'running')"
        ).fetchone()
    if runs[0] or fires[0]:
        raise InFlight(int(runs[0]), int(fires[0]))


def _refuse_non_empty(dst: Qmark, target: ClusterDB) -> None:
    for table, _order, _identity in TABLES:
        row = dst.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone()  # noqa: S608 - constant
        if row is not None:
            raise ClusterError(
                f"table {table} already has rows; nothing was copied",
                url=target.url,
                remedy="migrate into a new, empty database",
            )


def _copy(src: object, dst: Qmark, table: str, order: str, identity: str | None) -> int:
    cursor = src.execute(f"SELECT * FROM {table} ORDER BY {order}")  # type: ignore[attr-defined]  # noqa: S608
    names = [d[0] for d in cursor.description]
    marks = ", ".join("?" for _ in names)
    overriding = " OVERRIDING SYSTEM VALUE" if identity else ""
    sql = f"INSERT INTO {table} ({', '.join(names)}){overriding} VALUES ({marks})"  # noqa: S608
    copied = 0
    while rows := cursor.fetchmany(_CHUNK):
        dst.executemany(sql, [tuple(row) for row in rows])
        copied += len(rows)
    if identity and copied:
        # The next event or fire continues after the copied ones.
        dst.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', '{identity}'),"  # noqa: S608
            f" (SELECT max({identity}) FROM {table}))"
        )
    return copied
