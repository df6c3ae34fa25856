"""The board in SQL: :class:`SqlBoardStore`, and its SQLite form :class:`SqliteBoardStore`.

One write transaction per change, so the re-read at the start of a method and the write at its
end see the same board with no other board change in between (SQLite: ``BEGIN IMMEDIATE``;
PostgreSQL: a transaction-scoped advisory lock, see :mod:`dispatcher.cluster.database`); every
write bumps the board version. Reads use one transaction for a consistent snapshot.

The SQL is written once, in the dialect both backends share (``?`` placeholders, 0/1 flags,
JSON text; the building blocks are in :mod:`dispatcher.kanban.sql`); a backend supplies a
:class:`~dispatcher.kanban.sql.SqlDatabase` and the two spellings that differ (parent order,
id-prefix match). See :mod:`dispatcher.kanban.abc` for the contract.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dispatcher.kanban import rules
from dispatcher.kanban.abc import Claim, ClaimVerdict, Decide
from dispatcher.kanban.model import (
    BlockKind,
    Card,
    CardEdit,
    CardStatus,
    Event,
    EventKind,
    Limits,
    NewCard,
    Run,
    move_fields,
)
from dispatcher.kanban.rows import (
    CARD_COLUMNS,
    CARD_IDS,
    RUN_IDS,
    card_of,
    run_of,
)
from dispatcher.kanban.sql import (
    READY,
    READY_SINCE_SQL,
    WAITING_SQL,
    SqlConnection,
    SqlDatabase,
    ready_query,
)
from dispatcher.kanban.sqlhistory import SqlHistory
from registry.store.database import StateDB
from scope.foundation.errors import NotFoundError

if TYPE_CHECKING:
    from dispatcher.launch.claimant import Claimant
    from dispatcher.launch.limits import Tally, Wants
    from dispatcher.launch.outcome import Outcome, Result

__all__ = ["SqlBoardStore", "SqlConnection", "SqlDatabase", "SqliteBoardStore", "ready_query"]


class SqlBoardStore(SqlHistory):
    """The board in a SQL database (tables of :mod:`dispatcher.kanban.tables`)."""

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
                card_id = CARD_IDS.new()
                taken = conn.execute("SELECT 1 FROM kanban_cards WHERE id = ?", (card_id,))
                if taken.fetchone() is None:
                    break
            conn.execute(
                "INSERT INTO kanban_cards (id, title, body, assignee, status, priority,"
                " created_at, updated_at, idempotency_key, failure_limit, group_name, turn)"
                " VALUES (?, ?, ?, ?, 'todo', ?, ?, ?, ?, ?, ?, ?)",
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
                    new.group,
                    self._turn(conn, new.group),
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
        return self.get_card(self._resolve(text, CARD_IDS, "kanban_cards", "id"))

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
            if rules.joins_queue(card, change.fields):
                turn = self._turn(conn, change.fields["group"])
                change = dataclasses.replace(change, fields={**change.fields, "turn": turn})
            return self._apply(conn, card_id, change, now)

    # -- runs and events ---------------------------------------------------------------------

    def get_run(self, run_id: str) -> Run:
        with self.db.read() as conn:
            return self._load_run(conn, run_id)

    def resolve_run(self, text: str) -> Run:
        return self.get_run(self._resolve(text, RUN_IDS, "kanban_runs", "run_id"))

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
        waiting_sql = WAITING_SQL
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
                fields = {"status": CardStatus.READY, "turn": self._turn(conn, row[1])}
                self._update(conn, row[0], fields, now)
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

    def ready_cards(
        self, *, after: Card | None = None, limit: int | None = None, now: float | None = None
    ) -> list[Card]:
        sql, bound = ready_query(after=after, limit=limit, now=now)
        with self.db.read() as conn:
            rows = conn.execute(sql, bound).fetchall()
        return [card_of(row, ()) for row in rows]

    def backing_off(self, *, now: float, limit: int) -> list[str]:
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT id FROM kanban_cards WHERE {READY} AND retry_at IS NOT NULL"  # noqa: S608
                " AND retry_at > ? ORDER BY retry_at, id LIMIT ?",
                (now, int(limit)),
            ).fetchall()
        return [str(row[0]) for row in rows]

    def claim(
        self,
        card_id: str,
        *,
        now: float,
        claimer: Claimant,
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
            run_id = RUN_IDS.new()
            from dispatcher.launch import holds  # not on the path of the short write commands

            taking = holds.Taking(
                wants=limits.wants, holder=holds.Holder("run", run_id), group=card.group
            )
            wait = holds.try_take(conn, taking, now)
            if wait is not None:
                return Claim(verdict=ClaimVerdict.LIMIT, wait=wait)
            attempt = (
                conn.execute(
                    "SELECT COUNT(*) FROM kanban_runs WHERE card_id = ?", (card_id,)
                ).fetchone()[0]
                + 1
            )
            conn.execute(
                "INSERT INTO kanban_runs (run_id, card_id, attempt, claimed_at, claimer_pid,"  # noqa: S608
                f" claimer_start, claimer_boot, ready_at) VALUES (?, ?, ?, ?, ?, ?, ?,"
                f" {READY_SINCE_SQL})",
                (run_id, card_id, attempt, now, claimer.pid, claimer.start, claimer.boot, card_id),
            )
            self._stamp(conn, run_id)
            self._advance_round(conn, card)
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

    def limit_tallies(
        self, wants: Wants, *, now: float, host: str | None = None
    ) -> tuple[float, dict[str, Tally]]:
        from dispatcher.launch import holds

        with self.db.read() as conn:
            return now, holds.tallies(conn, wants, now, host=host, every_group=True)

    def prune_holds(self, before: float) -> int:
        from dispatcher.launch import holds

        with self.db.write() as conn:
            return holds.prune(conn, before)

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
        self, run_id: str, result: Result, decide: Decide, *, now: float
    ) -> tuple[Run, Card] | None:
        with self.db.write() as conn:
            return self._close(conn, run_id, result, decide, now)

    def _close(
        self,
        conn: SqlConnection,
        run_id: str,
        result: Result,
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
        from dispatcher.launch import holds

        holds.release(conn, holds.Holder("run", run_id), now)
        fields = dict(change.fields)
        if card.current_run_id == run_id:
            fields["current_run_id"] = None
        if fields:
            self._update(conn, card.id, fields, now)
        for kind, data in change.events:
            self._event(conn, card.id, kind, data, now, run_id, output=result.output)
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

    def retry(self, card_id: str, *, reason: str, now: float) -> Card:
        with self.db.write() as conn:
            change = rules.retry_change(self._load_card(conn, card_id), reason=reason)
            return self._apply(conn, card_id, change, now)

    def move(self, card_id: str, status: CardStatus, *, now: float) -> Card:
        rules.check_move_target(status)
        with self.db.write() as conn:
            card = self._load_card(conn, card_id)
            rules.refuse_with_open_run(card, "move")
            if card.status is status:
                return card
            fields = move_fields(card, status, now)
            if rules.joins_queue(card, fields):
                fields["turn"] = self._turn(conn, card.group)
            self._update(conn, card_id, fields, now)
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

    def outcome_counts(self) -> dict[tuple[Outcome, bool], int]:
        from dispatcher.launch.outcome import Outcome

        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT outcome, infrastructure, COUNT(*) FROM kanban_runs"
                " WHERE outcome IS NOT NULL GROUP BY outcome, infrastructure"
            ).fetchall()
        return {(Outcome(row[0]), bool(row[1])): int(row[2]) for row in rows}


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
