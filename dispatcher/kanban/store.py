"""The board in SQL: :class:`SqlBoardStore`, and its SQLite form :class:`SqliteBoardStore`.

One write transaction per change, so the re-read at the start of a method and the write at its
end see the same board with no other board change in between (SQLite: ``BEGIN IMMEDIATE``;
PostgreSQL: a transaction-scoped advisory lock, see :mod:`dispatcher.cluster.database`); every
write bumps the board version. Reads use one transaction for a consistent snapshot.

The SQL is written once, in the dialect both backends share (``?`` placeholders, 0/1 flags,
JSON text); a backend supplies a :class:`SqlDatabase` and the two spellings that differ
(parent order, id-prefix match). See :mod:`dispatcher.kanban.abc` for the contract.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from dispatcher.kanban import rules
from dispatcher.kanban.abc import BoardStore, Claim, ClaimVerdict, Decide
from dispatcher.kanban.model import (
    BlockKind,
    Card,
    CardEdit,
    CardStatus,
    Claimer,
    Event,
    EventKind,
    Limits,
    NewCard,
    Run,
    RunOutcome,
    RunResult,
    move_fields,
)
from dispatcher.kanban.rows import (
    CARD_COLUMNS,
    CARD_FIELDS,
    CARD_PREFIX,
    RUN_PREFIX,
    card_of,
    db_value,
    new_id,
    run_of,
)
from registry.errors import AmbiguousId
from registry.state import StateDB
from scope.foundation.errors import NotFoundError

# A parent counts as done when it is done, or was done before it was archived.
_UNDONE_PARENTS_SQL = (
    "SELECT COUNT(*) FROM kanban_parents p JOIN kanban_cards pc ON pc.id = p.parent_id"
    " WHERE p.card_id = ? AND NOT (pc.status = 'done'"
    " OR (pc.status = 'archived' AND pc.completed_at IS NOT NULL))"
)
_WAITING_SQL = (
    "SELECT c.id FROM kanban_cards c WHERE c.status = 'todo' AND NOT EXISTS ("
    " SELECT 1 FROM kanban_parents p JOIN kanban_cards pc ON pc.id = p.parent_id"
    " WHERE p.card_id = c.id AND NOT (pc.status = 'done'"
    " OR (pc.status = 'archived' AND pc.completed_at IS NOT NULL)))"
)


class SqlConnection(Protocol):
    """What the store needs of a connection: ``execute`` with ``?`` placeholders, returning a
    cursor whose rows answer both ``row[0]`` and ``row["name"]``."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any:
        """Run one statement."""


class SqlDatabase(Protocol):
    """A database handing out transactions (:class:`~registry.state.StateDB` is one)."""

    def read(self) -> AbstractContextManager[Any]:
        """A transaction for reading."""

    def write(self) -> AbstractContextManager[Any]:
        """A write transaction that excludes every other board write until it ends."""


class SqlBoardStore(BoardStore):
    """The board in a SQL database (tables of :mod:`dispatcher.kanban.schema`)."""

    PARENT_ORDER = "rowid"
    """The column that keeps parents in the order they were given."""
    PREFIX_MATCH = "{column} GLOB ? || '*'"
    """SQL true when ``{column}`` starts with the bound text (exact, index-friendly)."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _bump(conn: SqlConnection) -> None:
        conn.execute("UPDATE kanban_meta SET value = value + 1 WHERE key = 'board_version'")

    @staticmethod
    def _event(
        conn: SqlConnection,
        card_id: str,
        kind: EventKind,
        data: Mapping[str, Any],
        now: float,
        run_id: str | None = None,
    ) -> None:
        conn.execute(
            "INSERT INTO kanban_events (card_id, run_id, kind, at, data) VALUES (?, ?, ?, ?, ?)",
            (card_id, run_id, kind.value, now, json.dumps(dict(data), default=str)),
        )

    @staticmethod
    def _update(conn: SqlConnection, card_id: str, fields: Mapping[str, Any], now: float) -> None:
        unknown = set(fields) - CARD_FIELDS
        if unknown:
            raise ValueError(f"unknown card fields {sorted(unknown)}")
        values = {**fields, "updated_at": now}
        assignments = ", ".join(f"{name} = ?" for name in values)
        conn.execute(
            f"UPDATE kanban_cards SET {assignments} WHERE id = ?",  # noqa: S608 - names checked
            (*(db_value(v) for v in values.values()), card_id),
        )

    @classmethod
    def _parents(cls, conn: SqlConnection, card_ids: Sequence[str] | None) -> dict[str, list[str]]:
        if card_ids is None:
            rows = conn.execute(
                f"SELECT card_id, parent_id FROM kanban_parents ORDER BY {cls.PARENT_ORDER}"  # noqa: S608
            ).fetchall()
        else:
            rows = []
            ids = list(card_ids)
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows += conn.execute(
                    f"SELECT card_id, parent_id FROM kanban_parents WHERE card_id IN ({marks})"  # noqa: S608
                    f" ORDER BY {cls.PARENT_ORDER}",
                    chunk,
                ).fetchall()
        found: dict[str, list[str]] = {}
        for row in rows:
            found.setdefault(row[0], []).append(row[1])
        return found

    def _apply(
        self,
        conn: SqlConnection,
        card_id: str,
        change: rules.Change,
        now: float,
        run_id: str | None = None,
    ) -> Card:
        self._update(conn, card_id, change.fields, now)
        self._event(conn, card_id, change.kind, change.data, now, run_id)
        self._bump(conn)
        return self._load_card(conn, card_id)

    def _stamp(self, conn: SqlConnection, run_id: str) -> None:
        """Mark a run just claimed with whatever fences it (cluster mode: host and epoch)."""

    def _fenced(self, conn: SqlConnection, run_id: str) -> bool:
        """Whether writes about ``run_id`` still count (cluster mode: its host's epoch is
        current). A single host owns every run it claims."""
        return True

    def _host_open_count(self, conn: SqlConnection) -> int | None:
        """Open runs of this host (cluster mode), None where there is only one host."""
        return None

    @staticmethod
    def _open_count(conn: SqlConnection, card: Card | None = None) -> int:
        """Open runs on the board, or of ``card``'s assignee."""
        if card is None:
            row = conn.execute("SELECT COUNT(*) FROM kanban_runs WHERE outcome IS NULL")
        else:
            row = conn.execute(
                "SELECT COUNT(*) FROM kanban_runs r JOIN kanban_cards c ON c.id = r.card_id"
                " WHERE r.outcome IS NULL AND c.assignee = ?",
                (card.assignee,),
            )
        return int(row.fetchone()[0])

    def _load_card(self, conn: SqlConnection, card_id: str) -> Card:
        row = conn.execute(
            f"SELECT {CARD_COLUMNS} FROM kanban_cards WHERE id = ?",  # noqa: S608
            (card_id,),
        ).fetchone()
        if row is None:
            raise NotFoundError("card", card_id)
        return card_of(row, self._parents(conn, [card_id]).get(card_id, []))

    @staticmethod
    def _load_run(conn: SqlConnection, run_id: str) -> Run:
        row = conn.execute("SELECT * FROM kanban_runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise NotFoundError("run", run_id)
        return run_of(row)

    @staticmethod
    def _parents_done(conn: SqlConnection, card_id: str) -> bool:
        row = conn.execute(_UNDONE_PARENTS_SQL, (card_id,)).fetchone()
        return int(row[0]) == 0

    def _resolve(self, text: str, prefix: str, kind: str, table: str, column: str) -> str:
        full = rules.id_wanted(text, prefix, kind)
        with self.db.read() as conn:
            exact = conn.execute(
                f"SELECT {column} FROM {table} WHERE {column} = ?",  # noqa: S608 - constants
                (full,),
            ).fetchone()
            if exact is not None:
                return str(exact[0])
            rules.check_prefix_length(text, kind)
            match = self.PREFIX_MATCH.format(column=column)
            rows = conn.execute(
                f"SELECT {column} FROM {table} WHERE {match} ORDER BY {column} LIMIT 50",  # noqa: S608
                (full,),
            ).fetchall()
        if not rows:
            raise NotFoundError(kind, text)
        if len(rows) > 1:
            raise AmbiguousId(kind, text, [str(r[0]) for r in rows])
        return str(rows[0][0])

    # -- cards -------------------------------------------------------------------------------

    def add_card(self, new: NewCard, *, now: float) -> tuple[Card, bool]:
        with self.db.write() as conn:
            if new.idempotency_key is not None:
                row = conn.execute(
                    "SELECT id FROM kanban_cards WHERE idempotency_key = ?",
                    (new.idempotency_key,),
                ).fetchone()
                if row is not None:
                    return self._load_card(conn, row[0]), False
            for parent in new.parents:
                found = conn.execute("SELECT 1 FROM kanban_cards WHERE id = ?", (parent,))
                if found.fetchone() is None:
                    raise NotFoundError("card", parent, remedy="check the --parent ids")
            while True:
                card_id = new_id(CARD_PREFIX)
                taken = conn.execute("SELECT 1 FROM kanban_cards WHERE id = ?", (card_id,))
                if taken.fetchone() is None:
                    break
            conn.execute(
                "INSERT INTO kanban_cards (id, title, body, assignee, status, priority,"
                " created_at, updated_at, idempotency_key, failure_limit)"
                " VALUES (?, ?, ?, ?, 'todo', ?, ?, ?, ?, ?)",
                (
                    card_id,
                    new.title,
                    new.body,
                    new.assignee,
                    new.priority,
                    now,
                    now,
                    new.idempotency_key,
                    new.failure_limit,
                ),
            )
            for parent in dict.fromkeys(new.parents):
                conn.execute(
                    "INSERT INTO kanban_parents (card_id, parent_id) VALUES (?, ?)",
                    (card_id, parent),
                )
            status = rules.status_after_parents(self._parents_done(conn, card_id))
            if status is CardStatus.READY:
                conn.execute("UPDATE kanban_cards SET status = 'ready' WHERE id = ?", (card_id,))
            self._event(conn, card_id, EventKind.CREATED, rules.created_data(new, status), now)
            self._bump(conn)
            return self._load_card(conn, card_id), True

    def get_card(self, card_id: str) -> Card:
        with self.db.read() as conn:
            return self._load_card(conn, card_id)

    def resolve_card(self, text: str) -> Card:
        return self.get_card(self._resolve(text, CARD_PREFIX, "card", "kanban_cards", "id"))

    def list_cards(
        self,
        *,
        statuses: Sequence[CardStatus] | None = None,
        assignee: str | None = None,
        include_archived: bool = False,
        limit: int | None = None,
    ) -> list[Card]:
        clauses: list[str] = []
        params: list[Any] = []
        if statuses:
            clauses.append(f"status IN ({','.join('?' * len(statuses))})")
            params += [s.value for s in statuses]
        elif not include_archived:
            clauses.append("status != 'archived'")
        if assignee is not None:
            clauses.append("assignee = ?")
            params.append(assignee)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        if limit is not None:
            params.append(max(0, limit))
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {CARD_COLUMNS} FROM kanban_cards{where}"  # noqa: S608 - built above
                " ORDER BY priority DESC, created_at, id"
                + (" LIMIT ?" if limit is not None else ""),
                params,
            ).fetchall()
            parents = self._parents(conn, None if len(rows) > 500 else [r["id"] for r in rows])
        return [card_of(row, parents.get(row["id"], [])) for row in rows]

    def done_cards(self, *, offset: int = 0, limit: int = 50) -> list[Card]:
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {CARD_COLUMNS} FROM kanban_cards WHERE status = 'done'"  # noqa: S608
                " ORDER BY completed_at DESC, id LIMIT ? OFFSET ?",
                (max(0, limit), max(0, offset)),
            ).fetchall()
            parents = self._parents(conn, [r["id"] for r in rows])
        return [card_of(row, parents.get(row["id"], [])) for row in rows]

    def edit_card(self, card_id: str, edit: CardEdit, *, now: float) -> Card:
        with self.db.write() as conn:
            card = self._load_card(conn, card_id)
            change = rules.edit_change(card, edit)
            if change is None:
                return card
            return self._apply(conn, card_id, change, now)

    # -- runs and events ---------------------------------------------------------------------

    def get_run(self, run_id: str) -> Run:
        with self.db.read() as conn:
            return self._load_run(conn, run_id)

    def resolve_run(self, text: str) -> Run:
        return self.get_run(self._resolve(text, RUN_PREFIX, "run", "kanban_runs", "run_id"))

    def runs_of(self, card_id: str) -> list[Run]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM kanban_runs WHERE card_id = ? ORDER BY attempt", (card_id,)
            ).fetchall()
        return [run_of(row) for row in rows]

    def open_runs(self) -> list[Run]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT * FROM kanban_runs WHERE outcome IS NULL ORDER BY claimed_at"
            ).fetchall()
        return [run_of(row) for row in rows]

    def events_of(self, card_id: str) -> list[Event]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT seq, card_id, run_id, kind, at, data FROM kanban_events"
                " WHERE card_id = ? ORDER BY seq",
                (card_id,),
            ).fetchall()
        return [_event_of(row) for row in rows]

    def events_after(self, seq: int, *, limit: int = 500) -> list[Event]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT seq, card_id, run_id, kind, at, data FROM kanban_events"
                " WHERE seq > ? ORDER BY seq LIMIT ?",
                (seq, limit),
            ).fetchall()
        return [_event_of(row) for row in rows]

    def last_event_seq(self) -> int:
        with self.db.read() as conn:
            row = conn.execute("SELECT max(seq) FROM kanban_events").fetchone()
        return int(row[0] or 0)

    def append_event(
        self,
        card_id: str,
        kind: EventKind,
        data: Mapping[str, Any],
        *,
        now: float,
        run_id: str | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        with self.db.write() as conn:
            self._load_card(conn, card_id)
            if fields:
                self._update(conn, card_id, fields, now)
            self._event(conn, card_id, kind, data, now, run_id)
            self._bump(conn)

    # -- the dispatcher's steps --------------------------------------------------------------

    def promote(self, *, now: float) -> list[tuple[str, EventKind]]:
        waiting_sql = _WAITING_SQL
        expired_sql = (
            "SELECT id FROM kanban_cards WHERE status = 'blocked' AND block_kind = 'transient'"
            " AND blocked_until IS NOT NULL AND blocked_until <= ?"
        )
        with self.db.read() as conn:
            if (
                conn.execute(waiting_sql + " LIMIT 1").fetchone() is None
                and conn.execute(expired_sql + " LIMIT 1", (now,)).fetchone() is None
            ):
                return []
        done: list[tuple[str, EventKind]] = []
        with self.db.write() as conn:
            for row in conn.execute(waiting_sql).fetchall():
                self._update(conn, row[0], {"status": CardStatus.READY}, now)
                self._event(conn, row[0], EventKind.PROMOTED, {"reason": "parents done"}, now)
                done.append((row[0], EventKind.PROMOTED))
            for row in conn.execute(expired_sql, (now,)).fetchall():
                self._update(conn, row[0], rules.EXPIRED_BLOCK_FIELDS, now)
                self._event(
                    conn, row[0], EventKind.UNBLOCKED, {"reason": "transient block ended"}, now
                )
                done.append((row[0], EventKind.UNBLOCKED))
            if done:
                self._bump(conn)
        return done

    def ready_cards(self) -> list[Card]:
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {CARD_COLUMNS} FROM kanban_cards"  # noqa: S608 - constant
                " WHERE status = 'ready' AND current_run_id IS NULL"
                " ORDER BY priority DESC, created_at, id"
            ).fetchall()
        return [card_of(row, ()) for row in rows]

    def claim(
        self,
        card_id: str,
        *,
        now: float,
        claimer: Claimer,
        limits: Limits,
        ignore_cooldown: bool = False,
    ) -> Claim:
        with self.db.write() as conn:
            card = self._load_card(conn, card_id)
            paused = conn.execute("SELECT value FROM kanban_meta WHERE key = 'paused'").fetchone()
            refusal = rules.claim_refusal(
                card,
                paused=bool(paused is not None and paused[0]),
                now=now,
                ignore_cooldown=ignore_cooldown,
            )
            if refusal is None:
                mine = None if limits.assignee_max is None else self._open_count(conn, card)
                host = None if limits.host_max is None else self._host_open_count(conn)
                refusal = rules.budget_refusal(
                    limits, running=self._open_count(conn), mine=mine, host=host
                )
            if refusal is not None:
                return Claim(verdict=refusal)
            attempt = (
                conn.execute(
                    "SELECT COUNT(*) FROM kanban_runs WHERE card_id = ?", (card_id,)
                ).fetchone()[0]
                + 1
            )
            run_id = new_id(RUN_PREFIX)
            conn.execute(
                "INSERT INTO kanban_runs (run_id, card_id, attempt, claimed_at, claimer_pid,"
                " claimer_start) VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, card_id, attempt, now, claimer.pid, claimer.start),
            )
            self._stamp(conn, run_id)
            cursor = conn.execute(
                "UPDATE kanban_cards SET status = 'running', current_run_id = ?, started_at = ?,"
                " updated_at = ?, cooldown_until = NULL, retry_at = NULL"
                " WHERE id = ? AND status = 'ready' AND current_run_id IS NULL",
                (run_id, now, now, card_id),
            )
            if cursor.rowcount != 1:
                # Unreachable under the write lock; kept as the compare-and-set guard.
                raise RuntimeError(f"claim of {card_id} lost its compare-and-set")
            self._event(
                conn,
                card_id,
                EventKind.CLAIMED,
                {"attempt": attempt, "claimer_pid": claimer.pid},
                now,
                run_id,
            )
            self._bump(conn)
            return Claim(verdict=ClaimVerdict.CLAIMED, run=self._load_run(conn, run_id))

    def record_spawn(
        self,
        run_id: str,
        *,
        session_id: str,
        placement: str,
        unit: str | None,
        now: float,
    ) -> bool:
        with self.db.write() as conn:
            run = self._load_run(conn, run_id)
            if not run.open or run.session_id is not None or not self._fenced(conn, run_id):
                return False
            conn.execute(
                "UPDATE kanban_runs SET session_id = ?, placement = ?, unit = ?, started_at = ?"
                " WHERE run_id = ? AND outcome IS NULL AND session_id IS NULL",
                (session_id, placement, unit, now, run_id),
            )
            self._event(
                conn,
                run.card_id,
                EventKind.SPAWNED,
                {"session_id": session_id, "placement": placement, "unit": unit},
                now,
                run_id,
            )
            self._bump(conn)
            return True

    def close_run(
        self, run_id: str, result: RunResult, decide: Decide, *, now: float
    ) -> tuple[Run, Card] | None:
        with self.db.write() as conn:
            return self._close(conn, run_id, result, decide, now)

    def _close(
        self,
        conn: SqlConnection,
        run_id: str,
        result: RunResult,
        decide: Decide,
        now: float,
        *,
        fence: bool = True,
    ) -> tuple[Run, Card] | None:
        """:meth:`close_run` inside the caller's write transaction (``fence=False``: a rescue
        closing a run whose host lost it)."""
        run = self._load_run(conn, run_id)
        if not run.open or (fence and not self._fenced(conn, run_id)):
            return None
        card = self._load_card(conn, run.card_id)
        change = decide(card, run)
        conn.execute(
            "UPDATE kanban_runs SET outcome = ?, exit_code = ?, signal = ?, error = ?,"
            " infrastructure = ?, ended_at = ?, session_id = COALESCE(session_id, ?)"
            " WHERE run_id = ? AND outcome IS NULL",
            (
                result.outcome.value,
                result.exit_code,
                result.signal,
                result.error,
                int(result.infrastructure),
                now,
                result.session_id,
                run_id,
            ),
        )
        fields = dict(change.fields)
        if card.current_run_id == run_id:
            fields["current_run_id"] = None
        if fields:
            self._update(conn, card.id, fields, now)
        for kind, data in change.events:
            self._event(conn, card.id, kind, data, now, run_id)
        self._bump(conn)
        return self._load_run(conn, run_id), self._load_card(conn, card.id)

    # -- fenced worker commands --------------------------------------------------------------

    def worker_move(
        self,
        card_id: str,
        run_id: str,
        status: CardStatus,
        *,
        now: float,
        block_kind: BlockKind | None = None,
        blocked_until: float | None = None,
        reason: str | None = None,
        result: str | None = None,
    ) -> Card:
        with self.db.write() as conn:
            card = self._load_card(conn, card_id)
            row = conn.execute(
                "SELECT card_id, outcome FROM kanban_runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            change = rules.worker_move_change(
                card,
                run_id,
                run_card_id=None if row is None else row["card_id"],
                run_open=row is not None and row["outcome"] is None and self._fenced(conn, run_id),
                status=status,
                now=now,
                block_kind=block_kind,
                blocked_until=blocked_until,
                reason=reason,
                result=result,
            )
            return self._apply(conn, card_id, change, now, run_id)

    # -- operator commands -------------------------------------------------------------------

    def unblock(self, card_id: str, *, now: float) -> Card:
        with self.db.write() as conn:
            card = self._load_card(conn, card_id)
            change = rules.unblock_change(card, parents_done=self._parents_done(conn, card_id))
            return self._apply(conn, card_id, change, now)

    def move(self, card_id: str, status: CardStatus, *, now: float) -> Card:
        rules.check_move_target(status)
        with self.db.write() as conn:
            card = self._load_card(conn, card_id)
            rules.refuse_with_open_run(card, "move")
            if card.status is status:
                return card
            self._update(conn, card_id, move_fields(card, status, now), now)
            self._event(
                conn,
                card_id,
                EventKind.MOVED,
                {"from": card.status.value, "to": status.value, "by": "operator"},
                now,
            )
            self._bump(conn)
            return self._load_card(conn, card_id)

    def archive(self, card_id: str, *, now: float) -> Card:
        with self.db.write() as conn:
            card = self._load_card(conn, card_id)
            if card.status is CardStatus.ARCHIVED:
                return card
            rules.refuse_with_open_run(card, "archive")
            self._update(conn, card_id, {"status": CardStatus.ARCHIVED}, now)
            self._event(conn, card_id, EventKind.ARCHIVED, {"from": card.status.value}, now)
            self._bump(conn)
            return self._load_card(conn, card_id)

    # -- board-wide --------------------------------------------------------------------------

    def paused(self) -> bool:
        with self.db.read() as conn:
            row = conn.execute("SELECT value FROM kanban_meta WHERE key = 'paused'").fetchone()
        return bool(row and row[0])

    def set_paused(self, paused: bool) -> bool:
        with self.db.write() as conn:
            cursor = conn.execute(
                "UPDATE kanban_meta SET value = ? WHERE key = 'paused' AND value != ?",
                (int(paused), int(paused)),
            )
            if cursor.rowcount:
                self._bump(conn)
            return bool(cursor.rowcount)

    def board_version(self) -> int:
        with self.db.read() as conn:
            row = conn.execute(
                "SELECT value FROM kanban_meta WHERE key = 'board_version'"
            ).fetchone()
        return int(row[0]) if row else 0

    def status_counts(self) -> dict[CardStatus, int]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT status, COUNT(*) FROM kanban_cards GROUP BY status"
            ).fetchall()
        counts = dict.fromkeys(CardStatus, 0)
        for row in rows:
            counts[CardStatus(row[0])] = int(row[1])
        return counts

    def outcome_counts(self) -> dict[tuple[RunOutcome, bool], int]:
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT outcome, infrastructure, COUNT(*) FROM kanban_runs"
                " WHERE outcome IS NOT NULL GROUP BY outcome, infrastructure"
            ).fetchall()
        return {(RunOutcome(row[0]), bool(row[1])): int(row[2]) for row in rows}


def _event_of(row: Any) -> Event:
    return Event(
        seq=row["seq"],
        card_id=row["card_id"],
        run_id=row["run_id"],
        kind=row["kind"],
        at=row["at"],
        data=json.loads(row["data"]),
    )


class SqliteBoardStore(SqlBoardStore):
    """The board in the host's state database (component ``kanban``): the embedded default."""

    def __init__(self, db: StateDB) -> None:
        super().__init__(db)
