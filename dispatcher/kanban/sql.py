"""The board's SQL building blocks, shared by every SQL backend of the board store.

:class:`SqlBoard` holds the statements every board operation is made of (load a card or a
run, write card fields, append an event, bump the board version, resolve an id prefix) and the
hooks a cluster backend overrides to fence and stamp runs; :class:`~dispatcher.kanban.store.
SqlBoardStore` builds the contract's operations from them. The SQL is written once, in the
dialect both backends share (``?`` placeholders, 0/1 flags, JSON text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from dispatcher.kanban import notices, rules
from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.history import READY_KINDS
from dispatcher.kanban.model import Card, EventKind, Run
from dispatcher.kanban.rows import CARD_COLUMNS, CARD_FIELDS, COLUMN_OF, card_of, db_value, run_of
from dispatcher.launch.outbox import Outbox, Tail
from scope.foundation.errors import NotFoundError
from scope.foundation.ids import MAX_CANDIDATES, IdKind, lookup

__all__ = [
    "READY",
    "READY_SINCE_SQL",
    "UNDONE_PARENTS_SQL",
    "WAITING_SQL",
    "SqlBoard",
    "SqlConnection",
    "SqlDatabase",
    "ready_query",
]

# A parent counts as done when it is done, or was done before it was archived.
UNDONE_PARENTS_SQL = (
    "SELECT COUNT(*) FROM kanban_parents p JOIN kanban_cards pc ON pc.id = p.parent_id"
    " WHERE p.card_id = ? AND NOT (pc.status = 'done'"
    " OR (pc.status = 'archived' AND pc.completed_at IS NOT NULL))"
)
READY_SINCE_SQL = (
    "(SELECT max(at) FROM kanban_events WHERE card_id = ? AND kind IN ("  # noqa: S608
    + ", ".join(f"'{kind}'" for kind in sorted(READY_KINDS))
    + "))"
)
"""A claim's ``ready_at``: the card's latest event of :data:`~dispatcher.kanban.history.
READY_KINDS` (read before the claim's own event; bind the card id)."""
WAITING_SQL = (
    "SELECT c.id, c.group_name FROM kanban_cards c WHERE c.status = 'todo' AND NOT EXISTS ("
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
    """A database handing out transactions (:class:`~registry.store.database.StateDB` is one)."""

    def read(self) -> AbstractContextManager[Any]:
        """A transaction for reading."""

    def write(self) -> AbstractContextManager[Any]:
        """A write transaction that excludes every other board write until it ends."""


class SqlBoard(BoardStore):
    """The statements the board store is made of (see the module docstring); abstract: the
    contract's operations are :class:`~dispatcher.kanban.store.SqlBoardStore`'s."""

    PARENT_ORDER = "rowid"
    """The column that keeps parents in the order they were given."""
    PREFIX_MATCH = "{column} GLOB ? || '*'"
    """SQL true when ``{column}`` starts with the bound text (exact, index-friendly)."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db
        self.outbox: Outbox | None = None
        """Where routed events queue their notification (None: nobody listens)."""

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _bump(conn: SqlConnection) -> None:
        conn.execute("UPDATE kanban_meta SET value = value + 1 WHERE key = 'board_version'")

    def _event(
        self,
        conn: SqlConnection,
        card_id: str,
        kind: EventKind,
        data: Mapping[str, Any],
        now: float,
        run_id: str | None = None,
        *,
        output: Tail | None = None,
    ) -> None:
        """Append an event and queue its notification (``output``: the end of the worker's
        output, for the messages of a run's end)."""
        conn.execute(
            "INSERT INTO kanban_events (card_id, run_id, kind, at, data) VALUES (?, ?, ?, ?, ?)",
            (card_id, run_id, kind.value, now, json.dumps(dict(data), default=str)),
        )
        if self.outbox is not None:
            # Same connection, same transaction: the message commits with its event or not at all.
            notices.record(self.outbox, conn, card_id, kind, data, now, run_id, output)

    @staticmethod
    def _update(conn: SqlConnection, card_id: str, fields: Mapping[str, Any], now: float) -> None:
        unknown = set(fields) - CARD_FIELDS
        if unknown:
            raise ValueError(f"unknown card fields {sorted(unknown)}")
        values = {**fields, "updated_at": now}
        assignments = ", ".join(f"{COLUMN_OF.get(name, name)} = ?" for name in values)
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
    def _turn(conn: SqlConnection, group: str | None) -> int:
        """The turn of a card joining ``group``'s queue now (:func:`rules.turn_for`): two
        lookups on the group index and the meta table."""
        if group is None:
            row = conn.execute("SELECT max(turn) FROM kanban_cards WHERE group_name IS NULL")
        else:
            row = conn.execute("SELECT max(turn) FROM kanban_cards WHERE group_name = ?", (group,))
        last = row.fetchone()[0]
        round_ = conn.execute("SELECT value FROM kanban_meta WHERE key = 'round'").fetchone()
        return rules.turn_for(None if last is None else int(last), int(round_[0]))

    @staticmethod
    def _advance_round(conn: SqlConnection, card: Card) -> None:
        """The board's round after ``card`` was claimed (:func:`rules.round_after`)."""
        conn.execute(
            "UPDATE kanban_meta SET value = ? WHERE key = 'round' AND value < ?",
            (card.turn, card.turn),
        )

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
        row = conn.execute(UNDONE_PARENTS_SQL, (card_id,)).fetchone()
        return int(row[0]) == 0

    def _resolve(self, text: str, kind: IdKind, table: str, column: str) -> str:
        """The id ``text`` names, by the one id rule (:func:`scope.foundation.ids.lookup`)."""
        exact_sql = f"SELECT 1 FROM {table} WHERE {column} = ?"  # noqa: S608 - constants
        match = self.PREFIX_MATCH.format(column=column)
        prefix_sql = f"SELECT {column} FROM {table} WHERE {match} ORDER BY {column} LIMIT ?"  # noqa: S608
        with self.db.read() as conn:
            return lookup(
                text,
                kind,
                exists=lambda full: conn.execute(exact_sql, (full,)).fetchone() is not None,
                starting=lambda full: [
                    str(r[0]) for r in conn.execute(prefix_sql, (full, MAX_CANDIDATES)).fetchall()
                ],
            )


READY = "status = 'ready' AND current_run_id IS NULL"
"""A card a claim may take (the condition of the pick indexes)."""


def ready_query(
    *, after: Card | None = None, limit: int | None = None, now: float | None = None
) -> tuple[str, list[Any]]:
    """The SQL and parameters of :meth:`SqlBoardStore.ready_cards` (both backends)."""
    where, params = "", []
    if after is not None:
        # Keyset paging in the claim order (the pick index): (priority DESC, turn,
        # created_at, id).
        where = (
            " AND (priority < ? OR (priority = ? AND (turn > ? OR (turn = ? AND (created_at > ?"
            " OR (created_at = ? AND id > ?))))))"
        )
        params = [
            after.priority,
            after.priority,
            after.turn,
            after.turn,
            after.created_at,
            after.created_at,
            after.id,
        ]
    tail = "" if limit is None else f" LIMIT {int(limit)}"
    pick = f"SELECT {CARD_COLUMNS} FROM kanban_cards WHERE {READY}"  # noqa: S608
    order = " ORDER BY priority DESC, turn, created_at, id"
    if now is None:
        return f"{pick}{where}{order}{tail}", params
    # Two partial indexes: the cards that never backed off in pick order, and those whose
    # back-off ran out by retry_at. Cards still backing off are in neither range, so however
    # many there are, a page reads only what it returns.
    sql = (
        f"SELECT * FROM ({pick} AND retry_at IS NULL{where}{order}{tail}) AS fresh"  # noqa: S608
        f" UNION ALL SELECT * FROM ({pick} AND retry_at IS NOT NULL AND retry_at <= ?"
        f"{where}{order}{tail}) AS due{order}{tail}"
    )
    return sql, [*params, now, *params]
