"""Durable events: the ``registry_events`` table, acknowledgement by id, and its bound.

Events are rows of the state database, so every ``dispatch`` process on the state dir sees the
same ones and a consumer that restarts finds what it did not acknowledge. Inserting is always
part of a bigger write transaction of the caller (finalizing a session, advancing a heartbeat
offset, a handoff): :meth:`EventStore.insert` takes the open connection. It bumps the session's
``event_seq`` in the same transaction, so per-session sequence numbers never repeat even after
old events were trimmed.

Bound: beyond ``registry.max_pending_events`` rows the oldest *acknowledged* events go first.
Unacknowledged events are only dropped beyond the hard cap ``registry.max_unacked_events``, and
then with a warning in the log naming the count and the setting.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from registry.abc import AckResult, Event, EventType, Owner, SessionState
from registry.store.database import StateDB

__all__ = ["EventDraft", "EventStore", "new_event_id", "owner_filter"]

_log = logging.getLogger("dispatch.registry")

_EVENT_COLUMNS = (
    "position, id, session_id, seq, type, owner, created_at, acked_at, state, exit_code,"
    " signal, completion_reason, output, output_cut, log_path, note, data"
)


def new_event_id() -> str:
    """``e_`` + 16 hex digits."""
    return "e_" + secrets.token_hex(8)


@dataclass(frozen=True, kw_only=True)
class EventDraft:
    """An event before it is stored (id, sequence number and owner are assigned then)."""

    type: EventType
    state: SessionState | None = None
    exit_code: int | None = None
    signal: str | None = None
    completion_reason: str | None = None
    output: str = ""
    output_cut: int = 0
    log_path: str | None = None
    note: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


def owner_filter(owner: Owner | str) -> tuple[str, list[Any]]:
    """SQL condition and parameters for "routed to ``owner``": exact, or (for a string) a
    prefix ending at ``:``."""
    if isinstance(owner, Owner):
        return "owner = ?", [str(owner)]
    text = owner.strip()
    return "(owner = ? OR substr(owner, 1, ?) = ?)", [text, len(text) + 1, text + ":"]


def _row_to_event(row: sqlite3.Row) -> Event:
    return Event(
        id=row["id"],
        seq=int(row["seq"]),
        type=EventType(row["type"]),
        session_id=row["session_id"],
        owner=Owner.parse(row["owner"]),
        created_at=float(row["created_at"]),
        position=int(row["position"]),
        state=SessionState(row["state"]) if row["state"] else None,
        exit_code=row["exit_code"],
        signal=row["signal"],
        completion_reason=row["completion_reason"],
        output=row["output"] or "",
        output_cut=int(row["output_cut"] or 0),
        log_path=row["log_path"],
        note=row["note"],
        data=json.loads(row["data"] or "{}"),
        acked_at=row["acked_at"],
    )


class EventStore:
    """Queries and writes of ``registry_events`` and ``registry_handoffs``."""

    def __init__(self, db: StateDB, *, max_pending: int, max_unacked: int) -> None:
        self.db = db
        self.max_pending = max_pending
        self.hard_cap = max(max_unacked, max_pending)

    # -- writing (inside the caller's transaction) -------------------------------------------

    def insert(
        self, conn: sqlite3.Connection, session_id: str, draft: EventDraft, *, created_at: float
    ) -> Event | None:
        """Store ``draft`` for the session's *current* owner with the next sequence number;
        None when the session row is gone. Runs in the caller's write transaction."""
        row = conn.execute(
            "UPDATE registry_sessions SET event_seq = event_seq + 1 WHERE id = ?"
            " RETURNING event_seq, owner_kind, owner_id",
            (session_id,),
        ).fetchone()
        if row is None:
            return None
        owner = Owner(kind=row["owner_kind"], id=row["owner_id"])
        event = Event(
            id=new_event_id(),
            seq=int(row["event_seq"]),
            type=draft.type,
            session_id=session_id,
            owner=owner,
            created_at=created_at,
            state=draft.state,
            exit_code=draft.exit_code,
            signal=draft.signal,
            completion_reason=draft.completion_reason,
            output=draft.output,
            output_cut=draft.output_cut,
            log_path=draft.log_path,
            note=draft.note,
            data=dict(draft.data),
        )
        cursor = conn.execute(
            "INSERT INTO registry_events (id, session_id, seq, type, owner, created_at, state,"
            " exit_code, signal, completion_reason, output, output_cut, log_path, note, data)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                event.id,
                session_id,
                event.seq,
                event.type.value,
                str(owner),
                created_at,
                event.state.value if event.state else None,
                event.exit_code,
                event.signal,
                event.completion_reason,
                event.output,
                event.output_cut,
                event.log_path,
                event.note,
                json.dumps(dict(event.data)),
            ),
        )
        self._trim(conn)
        return replace(event, position=int(cursor.lastrowid or 0))

    def amend_signal(self, conn: sqlite3.Connection, event_id: str, signal: str) -> None:
        """Correct the signal of a stored event (a kill learning the real signal late)."""
        conn.execute("UPDATE registry_events SET signal = ? WHERE id = ?", (signal, event_id))

    def _trim(self, conn: sqlite3.Connection) -> None:
        total = conn.execute("SELECT COUNT(*) FROM registry_events").fetchone()[0]
        if total <= self.max_pending:
            return
        excess = total - self.max_pending
        total -= conn.execute(
            "DELETE FROM registry_events WHERE position IN (SELECT position FROM"
            " registry_events WHERE acked_at IS NOT NULL ORDER BY position LIMIT ?)",
            (excess,),
        ).rowcount
        if total <= self.hard_cap:
            return
        dropped = conn.execute(
            "DELETE FROM registry_events WHERE position IN (SELECT position FROM"
            " registry_events WHERE acked_at IS NULL ORDER BY position LIMIT ?)",
            (total - self.hard_cap,),
        ).rowcount
        _log.warning(
            "dropped the %d oldest unacknowledged events: more than %d are stored "
            "(registry.max_unacked_events); acknowledge events with 'dispatch events --ack'",
            dropped,
            self.hard_cap,
        )

    # -- reading -----------------------------------------------------------------------------

    def list(
        self,
        *,
        owner: Owner | str | None = None,
        include_acked: bool = False,
        session_id: str | None = None,
        after: int | None = None,
        limit: int | None = None,
        types: Iterable[EventType] | None = None,
    ) -> list[Event]:
        """Events, oldest first (see :meth:`registry.abc.Registry.events`)."""
        where: list[str] = []
        params: list[Any] = []
        if owner is not None:
            clause, values = owner_filter(owner)
            where.append(clause)
            params.extend(values)
        if not include_acked:
            where.append("acked_at IS NULL")
        if session_id is not None:
            where.append("session_id = ?")
            params.append(session_id)
        if after is not None:
            where.append("position > ?")
            params.append(after)
        if types is not None:
            wanted = [EventType(t).value for t in types]
            where.append(f"type IN ({', '.join('?' * len(wanted))})")
            params.extend(wanted)
        sql = f"SELECT {_EVENT_COLUMNS} FROM registry_events"  # noqa: S608 - our names
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY position"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(max(0, int(limit)))
        with self.db.read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [_row_to_event(r) for r in rows]

    # -- acknowledging -----------------------------------------------------------------------

    def ack(self, event_ids: Iterable[str], *, now: float) -> AckResult:
        """Acknowledge by id (idempotent)."""
        ids = list(dict.fromkeys(i.strip() for i in event_ids if i and i.strip()))
        acked: list[str] = []
        already: list[str] = []
        unknown: list[str] = []
        with self.db.write() as conn:
            for event_id in ids:
                row = conn.execute(
                    "SELECT acked_at FROM registry_events WHERE id = ?", (event_id,)
                ).fetchone()
                if row is None:
                    unknown.append(event_id)
                elif row["acked_at"] is not None:
                    already.append(event_id)
                else:
                    conn.execute(
                        "UPDATE registry_events SET acked_at = ? WHERE id = ? AND acked_at IS NULL",
                        (now, event_id),
                    )
                    acked.append(event_id)
        return AckResult(acked=tuple(acked), already=tuple(already), unknown=tuple(unknown))

    # -- handoffs ----------------------------------------------------------------------------

    def handoffs_by(self, conn: sqlite3.Connection, owner: Owner) -> int:
        """How many sessions ``owner`` handed to others (in the caller's transaction)."""
        return int(
            conn.execute(
                "SELECT COUNT(*) FROM registry_handoffs WHERE from_owner = ?", (str(owner),)
            ).fetchone()[0]
        )

    def record_handoff(
        self,
        conn: sqlite3.Connection,
        *,
        session_id: str,
        from_owner: Owner,
        to_owner: Owner,
        note: str,
        at: float,
    ) -> None:
        """Remember a handoff (counts toward the giver's limit)."""
        conn.execute(
            "INSERT INTO registry_handoffs (session_id, from_owner, to_owner, note, at)"
            " VALUES (?, ?, ?, ?, ?)",
            (session_id, str(from_owner), str(to_owner), note, at),
        )

    # -- pruning -----------------------------------------------------------------------------

    def forget_sessions(self, conn: sqlite3.Connection, session_ids: Iterable[str]) -> None:
        """Rows of sessions being pruned: acknowledged events and handoffs go with them;
        unacknowledged events stay until acknowledged or trimmed."""
        for sid in session_ids:
            conn.execute(
                "DELETE FROM registry_events WHERE session_id = ? AND acked_at IS NOT NULL",
                (sid,),
            )
            conn.execute("DELETE FROM registry_handoffs WHERE session_id = ?", (sid,))
