"""The board in the cluster database: :class:`PgBoardStore`.

The board's SQL is the SQLite store's (:class:`dispatcher.kanban.store.SqlBoardStore`), run
through :class:`~dispatcher.cluster.database.ClusterDB`, whose write transactions hold the
board's advisory lock; this module adds what only a cluster has:

* **claims** (:meth:`PgBoardStore.claim`) in one transaction that holds the board lock *shared*
  (claims of several hosts overlap; every other board write excludes them), picks the card
  with ``FOR UPDATE SKIP LOCKED`` in a CTE (a card another host is claiming is skipped, never
  waited for, and never more than the one row is locked), then, under :data:`BUDGET_LOCK`,
  counts the open runs (cluster-wide, the assignee's, this host's), checks this host's lease on
  the database clock, and writes the run stamped with host and epoch, the card, the event, the
  board version and the notification in one statement. The count and the insert are serialized
  by that lock and nothing else is, so the caps hold however many hosts claim at once, and the
  cost of a claim is a few index lookups whatever the size of the board;
* every run is stamped with the claiming host and its lease epoch (:class:`HostStamp`);
* every write about a run is **fenced**: it changes nothing unless the run's epoch is still its
  host's current epoch (and, for a host's own writes, the run is this host's at this epoch);
* a store stamped for a host sees only that host's open runs in :meth:`PgBoardStore.open_runs`
  (the runs it reconciles against its own registry: another host's sessions are not here);
* :meth:`PgBoardStore.close_stale` closes the open runs of a host from older epochs as ``lost``
  (infrastructure: never counted against the card) inside a rescue's transaction
  (:mod:`dispatcher.cluster.rescue`).
"""

from __future__ import annotations

import functools
import json
import string
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.cluster.database import BUDGET_LOCK, ClusterDB, Qmark, database_clock
from dispatcher.cluster.faults import ClusterFault
from dispatcher.cluster.wake import CHANNEL
from dispatcher.kanban import rules
from dispatcher.kanban.abc import Claim, ClaimVerdict
from dispatcher.kanban.model import Card, EventKind, Limits, Run
from dispatcher.kanban.rows import CARD_COLUMNS, RUN_IDS, card_of, db_value, run_of
from dispatcher.kanban.sql import READY_SINCE_SQL, SqlConnection
from dispatcher.kanban.store import SqlBoardStore
from dispatcher.kanban.taxonomy import Breaker, after_run
from dispatcher.launch import holds
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.holds import Holder, Taking
from dispatcher.launch.limits import Tally, Wants
from dispatcher.launch.limits import refusal as limit_refusal
from dispatcher.launch.outcome import Outcome, Result


@dataclass(kw_only=True)
class HostStamp:
    """Which host writes, and under which epoch (updated when the host rejoins)."""

    host_id: str
    epoch: int


# The CTE is materialized (it locks), so exactly the one row asked for is locked, and the
# budget lock is taken only once a card was picked.
_PICK = (
    "WITH picked AS ("  # noqa: S608 - constant column list
    f" SELECT {CARD_COLUMNS} FROM kanban_cards"
    " WHERE id = ? AND status = 'ready' AND current_run_id IS NULL"
    " LIMIT 1 FOR UPDATE SKIP LOCKED)"
    " SELECT picked.*, pg_advisory_xact_lock(?)::text AS gate FROM picked"
)
# Read after the budget lock (a new snapshot per statement), so every claim committed before
# it is counted. Each count walks a partial index of open runs, never the board. ``clock`` is
# the database's clock after the lock (moved by a test's shift): the time the claim's limits
# are counted and taken at; the named limits' counts (holds.counts) follow the columns here.
_FACTS = (
    "WITH clock AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 + ? AS t)"
    " SELECT (SELECT value FROM kanban_meta WHERE key = 'paused') AS paused,"
    " (SELECT count(*) FROM kanban_runs WHERE outcome IS NULL) AS running,"
    " (SELECT count(*) FROM kanban_runs WHERE outcome IS NULL AND host_id = ?) AS host,"
    " (SELECT count(*) FROM kanban_runs r JOIN kanban_cards c ON c.id = r.card_id"
    "  WHERE r.outcome IS NULL AND c.assignee = ?) AS mine,"
    " (SELECT count(*) FROM kanban_runs WHERE card_id = ?) AS attempts,"
    " EXISTS (SELECT 1 FROM hosts WHERE host_id = ? AND epoch = ?"
    "  AND lease_until > now() + make_interval(secs => ?)) AS leased,"
    " (SELECT t FROM clock) AS clock"
)
_FACT_COLUMNS = 7
_CLOCK = "(SELECT t FROM clock)"


@functools.cache
def _claim_sql(marks: str = "") -> str:
    """The claim's one statement; ``marks``: the ``VALUES`` of the run's limit holds (its
    parameters come first)."""
    fields = rules.claimed_fields("", 0.0)
    assignments = ", ".join(f"{name} = ?" for name in (*fields, "updated_at"))
    held = ""
    if marks:  # marks and columns are constants of ours, never input
        held = f"held AS (INSERT INTO limit_holds ({holds.HOLD_COLUMNS}) VALUES {marks}),"  # noqa: S608
    return (
        f"WITH {held} run AS (INSERT INTO kanban_runs (run_id, card_id, attempt, claimed_at,"  # noqa: S608
        " claimer_pid, claimer_start, claimer_boot, host_id, epoch, ready_at)"
        f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, {READY_SINCE_SQL})"
        " RETURNING *),"
        f" card AS (UPDATE kanban_cards SET {assignments}"
        " WHERE id = ? AND status = 'ready' AND current_run_id IS NULL RETURNING id),"
        " event AS (INSERT INTO kanban_events (card_id, run_id, kind, at, data)"
        " SELECT id, ?, ?, ?, ? FROM card),"
        " bump AS (UPDATE kanban_meta SET value = value + 1 WHERE key = 'board_version'),"
        " turn AS (UPDATE kanban_meta SET value = ? WHERE key = 'round' AND value < ?)"
        " SELECT run.*, (SELECT count(*) FROM card) AS cas, pg_notify(?, '')::text AS woke"
        " FROM run"
    )


class PgBoardStore(SqlBoardStore):
    """Cards, runs and events shared by every host of a cluster (see the module docstring).

    ``host_max`` is this host's ``kanban.max_in_progress_per_host`` (None: only the
    cluster-wide cap), used when the caller's limits name none. ``shift`` moves the database
    clock the lease check and the named limits see (tests only)."""

    PARENT_ORDER = "position"
    PREFIX_MATCH = "starts_with({column}, ?)"
    # The history and search reads' spellings (dispatcher.kanban.sqlhistory): the same
    # buckets, ASCII-only case folding and byte order as SQLite's.
    BUCKET = "floor(({column} - ?) / ?)::bigint"
    JSON_TEXT = "({column}::json ->> '{key}')"
    TITLE_HAS = (
        f"strpos(translate(c.title, '{string.ascii_uppercase}', '{string.ascii_lowercase}'), ?) > 0"
    )
    GREATEST = "greatest"
    TEXT_ORDER = ' COLLATE "C"'
    RUN_HOST = "r.host_id"

    def __init__(
        self,
        db: ClusterDB,
        stamp: HostStamp | None = None,
        *,
        host_max: int | None = None,
        shift: Callable[[], float] = lambda: 0.0,
        fault: ClusterFault | None = None,
    ) -> None:
        super().__init__(db)
        self.cluster = db
        self.stamp = stamp
        self.host_max = host_max
        self.shift = shift
        self.fault = fault or ClusterFault()

    @staticmethod
    def _bump(conn: SqlConnection) -> None:
        SqlBoardStore._bump(conn)
        # Delivered to every listening host when this transaction commits (never before).
        conn.execute("SELECT pg_notify(?, '')", (CHANNEL,))

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

    # -- claims ------------------------------------------------------------------------------

    def claim(
        self,
        card_id: str,
        *,
        now: float,
        claimer: Claimant,
        limits: Limits,
        ignore_cooldown: bool = False,
    ) -> Claim:
        stamp = self.stamp
        host = None if stamp is None else stamp.host_id
        epoch = None if stamp is None else stamp.epoch
        with self.cluster.write(shared=True) as conn:
            row = conn.execute(_PICK, (card_id, BUDGET_LOCK)).fetchone()
            if row is None:
                return Claim(verdict=ClaimVerdict.NOT_READY)
            card = card_of(row, ())
            shift = self.shift()
            parts, counted = holds.counts(
                limits.wants, 0.0, host=host, group=card.group, clock=_CLOCK
            )
            facts = conn.execute(
                ", ".join([_FACTS, *parts]),
                (shift, host, card.assignee, card_id, host, epoch, shift, *counted),
            ).fetchone()
            assert facts is not None  # a SELECT without FROM returns its one row
            refusal = rules.claim_refusal(
                card, paused=bool(facts["paused"]), now=now, ignore_cooldown=ignore_cooldown
            )
            if refusal is None and stamp is not None and not facts["leased"]:
                refusal = ClaimVerdict.NO_LEASE
            if refusal is None:
                host_max = limits.host_max if limits.host_max is not None else self.host_max
                refusal = rules.budget_refusal(
                    Limits(
                        max_in_progress=limits.max_in_progress,
                        assignee_max=limits.assignee_max,
                        host_max=host_max if stamp is not None else None,
                    ),
                    running=int(facts["running"]),
                    mine=int(facts["mine"]),
                    host=int(facts["host"]),
                )
            if refusal is not None:
                return Claim(verdict=refusal)
            run_id = RUN_IDS.new()
            # Still under the budget lock: the holds read here are every hold committed; the
            # claim's statement writes the new ones with the run.
            taking = Taking(
                wants=limits.wants, holder=Holder("run", run_id), host=host, group=card.group
            )
            clock = float(facts["clock"])
            values = list(facts)[_FACT_COLUMNS:]
            seen = holds.read_counts(conn, values, limits.wants, clock, host=host, group=card.group)
            wait = limit_refusal(limits.wants, seen, group=card.group)
            if wait is not None:
                return Claim(verdict=ClaimVerdict.LIMIT, wait=wait)
            self.fault.reach("claim_counted")
            attempt = int(facts["attempts"]) + 1
            run = self._insert_claim(conn, taking, card, attempt, now, claimer, clock)
        return Claim(verdict=ClaimVerdict.CLAIMED, run=run)

    def _clock(self, conn: SqlConnection) -> float:
        """The database's clock now (read after the budget lock, so later than every hold
        already taken), moved by ``shift`` in tests: the clock every host's limits share."""
        assert isinstance(conn, Qmark)
        return database_clock(conn) + self.shift()

    def limit_tallies(
        self, wants: Wants, *, now: float, host: str | None = None
    ) -> tuple[float, dict[str, Tally]]:
        with self.db.read() as conn:
            clock = self._clock(conn)
            return clock, holds.tallies(conn, wants, clock, host=host, every_group=True)

    def _insert_claim(
        self,
        conn: SqlConnection,
        taking: Taking,
        card: Card,
        attempt: int,
        now: float,
        claimer: Claimant,
        clock: float,
    ) -> Run:
        stamp = self.stamp
        card_id = card.id
        run_id = taking.holder.id
        marks, held = holds.rows(taking, clock) if taking.wants else ("", [])
        fields = rules.claimed_fields(run_id, now)
        data = json.dumps({"attempt": attempt, "claimer_pid": claimer.pid})
        got = conn.execute(
            _claim_sql(marks),
            (
                *held,
                run_id,
                card_id,
                attempt,
                now,
                claimer.pid,
                claimer.start,
                claimer.boot,
                None if stamp is None else stamp.host_id,
                None if stamp is None else stamp.epoch,
                card_id,
                *(db_value(v) for v in fields.values()),
                now,
                card_id,
                run_id,
                EventKind.CLAIMED.value,
                now,
                data,
                card.turn,
                card.turn,
                CHANNEL,
            ),
        ).fetchone()
        if got is None or got["cas"] != 1:
            # Unreachable while we hold the card's row lock; kept as the compare-and-set guard.
            raise RuntimeError(f"claim of {card_id} lost its compare-and-set")
        return run_of(got)

    # -- this host's view --------------------------------------------------------------------

    def open_runs(self) -> list[Run]:
        if self.stamp is None:
            return super().open_runs()
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM kanban_runs WHERE outcome IS NULL AND host_id = ?"
                " ORDER BY claimed_at",
                (self.stamp.host_id,),
            ).fetchall()
        return [run_of(row) for row in rows]

    def open_counts(self) -> tuple[int, int]:
        """(open runs cluster-wide, open runs of this host): what a tick may still claim."""
        host = None if self.stamp is None else self.stamp.host_id
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM kanban_runs WHERE outcome IS NULL),"
                " (SELECT count(*) FROM kanban_runs WHERE outcome IS NULL AND host_id = ?)",
                (host,),
            ).fetchone()
        return int(row[0]), int(row[1])

    def foreign_runs(self, run_ids: list[str]) -> set[str]:
        """Which of these runs are no longer this host's at its current epoch (closed, or
        rescued by another host): a worker of one of them is foreign and must not run on."""
        stamp = self.stamp
        if stamp is None or not run_ids:
            return set()
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT run_id FROM kanban_runs WHERE run_id = ANY(?) AND NOT (outcome IS NULL"
                " AND host_id IS NOT DISTINCT FROM ? AND epoch IS NOT DISTINCT FROM ?)",
                (run_ids, stamp.host_id, stamp.epoch),
            ).fetchall()
        return {row[0] for row in rows}

    def run_hosts(self, card_id: str) -> dict[str, str | None]:
        """The host of each of the card's runs (``kanban show``)."""
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT run_id, host_id FROM kanban_runs WHERE card_id = ?", (card_id,)
            ).fetchall()
        return {row["run_id"]: row["host_id"] for row in rows}

    # -- rescue ------------------------------------------------------------------------------

    def close_stale(
        self, conn: SqlConnection, host_id: str, epoch: int, now: float, why: str
    ) -> list[str]:
        """Inside the caller's write transaction: close ``host_id``'s open runs from epochs
        before ``epoch`` as ``lost`` (infrastructure: the card is ready again, nothing is
        counted). Returns their run ids."""
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

    def rescue_stale(self, host_id: str, epoch: int, *, now: float) -> list[str]:
        """Close this host's open runs from epochs before ``epoch`` (after a join started a new
        epoch: the machine rebooted, so those workers are gone)."""
        with self.db.write() as conn:
            return self.close_stale(conn, host_id, epoch, now, f"host {host_id} restarted")
