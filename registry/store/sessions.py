"""Durable sessions: the ``registry`` component of the state database.

Every ``dispatch`` process on the same state dir sees the same sessions, so any of them can list
sessions, read their output and finalize them. Finalizing is a compare-and-set on
``state = 'running'``: when two registry instances notice the same exit, exactly one stores the
final state (and publishes the completion).

A kill records its intent (state to record, reason, time) before it signals anything, so
whichever instance finalizes the session later records ``killed`` rather than a plain exit.

Events (:mod:`registry.store.events`) are written in the same transactions: the completion event
with the compare-and-set that finalizes (so there is exactly one, and only once the final
state is stored), a heartbeat with the compare-and-set that advances the heartbeat offset, a
handoff with the owner change.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from registry.abc import Event, Owner, Session, SessionState, WatchPattern
from registry.store.changes import (
    Counted,
    FinalFields,
    HandoffResult,
    HeartbeatMark,
    Placed,
    SessionChange,
    Started,
    WatchMark,
)
from registry.store.database import StateDB
from registry.store.events import EventDraft, EventStore
from registry.store.retention import due_for_pruning
from registry.store.tables import COMPONENT
from registry.usage import ResourceClass, Usage
from scope.abc import CallerKind, Placement

__all__ = [
    "COMPONENT",
    "Counted",
    "FinalFields",
    "HandoffResult",
    "HeartbeatMark",
    "KillIntent",
    "Placed",
    "SessionChange",
    "SessionStore",
    "Started",
    "StoredSession",
    "WatchMark",
]


@dataclass(frozen=True, kw_only=True)
class KillIntent:
    """A kill in progress: what to record once the worker is gone."""

    state: SessionState
    reason: str
    requested_at: float
    signalled_at: float | None = None
    """When the kill sent its first signal (None: nothing signalled yet). An exit recorded
    before it was the worker's own doing."""


@dataclass(frozen=True, kw_only=True)
class StoredSession:
    """A row: the public :class:`Session` plus what only the registry needs."""

    session: Session
    dir: str
    created_at: float
    output_chars: int | None
    kill: KillIntent | None
    heartbeat_liveness: bool = False
    hb_offset: int = 0
    """Log bytes already carried by heartbeats."""
    hb_at: float | None = None
    """Wall time of the last heartbeat (or of the start)."""
    watch_state: Mapping[str, Any] = field(default_factory=dict)
    emitter: str | None = None
    """The registry instance that publishes this session's heartbeat and watch events."""


_COLUMNS = (
    "id, argv, cwd, owner_kind, owner_id, caller, placement, unit, state, dir, log_path, pty,"
    " keeper_pid, keeper_start, worker_pid, worker_start, created_at, started_at, finished_at,"
    " exit_code, signal, completion_reason, total_bytes, dropped_bytes, timeout, output_chars,"
    " labels, warning, kill_state, kill_reason, kill_requested_at, notify, heartbeat,"
    " heartbeat_liveness, hb_offset, hb_at, watch, watch_state, emitter, handoff_note,"
    " handoff_from, kill_signalled_at, usage, resources"
)

_MARKS = ", ".join("?" * 44)


def _watch_of(text: str | None) -> tuple[WatchPattern, ...]:
    items = json.loads(text or "[]")
    return tuple(WatchPattern(pattern=str(i["pattern"]), regex=bool(i["regex"])) for i in items)


def _class_json(value: ResourceClass | None) -> str | None:
    return None if value is None else json.dumps(value.to_json())


def watch_json(patterns: Iterable[WatchPattern]) -> str:
    """The stored form of watch patterns."""
    return json.dumps([{"pattern": p.pattern, "regex": p.regex} for p in patterns])


def _row_to_stored(row: sqlite3.Row) -> StoredSession:
    kill = None
    if row["kill_state"]:
        kill = KillIntent(
            state=SessionState(row["kill_state"]),
            reason=row["kill_reason"] or "",
            requested_at=float(row["kill_requested_at"] or 0.0),
            signalled_at=row["kill_signalled_at"],
        )
    session = Session(
        id=row["id"],
        argv=tuple(json.loads(row["argv"])),
        cwd=_path_text(row["cwd"]),
        owner=Owner(kind=row["owner_kind"], id=row["owner_id"]),
        caller=CallerKind(row["caller"]),
        placement=Placement(row["placement"]),
        unit=row["unit"],
        state=SessionState(row["state"]),
        log_path=row["log_path"],
        pty=bool(row["pty"]),
        keeper_pid=row["keeper_pid"],
        keeper_start=row["keeper_start"],
        worker_pid=row["worker_pid"],
        worker_start=row["worker_start"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        exit_code=row["exit_code"],
        signal=row["signal"],
        completion_reason=row["completion_reason"],
        total_bytes=int(row["total_bytes"] or 0),
        dropped_bytes=int(row["dropped_bytes"] or 0),
        timeout=row["timeout"],
        labels=json.loads(row["labels"] or "{}"),
        warning=row["warning"],
        notify=bool(row["notify"]),
        heartbeat=row["heartbeat"],
        watch=_watch_of(row["watch"]),
        handoff_note=row["handoff_note"],
        handoff_from=Owner.parse(row["handoff_from"]) if row["handoff_from"] else None,
        usage=Usage.from_json(json.loads(row["usage"] or "{}")),
        resources=ResourceClass.from_json(json.loads(row["resources"] or "{}")),
    )
    return StoredSession(
        session=session,
        dir=row["dir"],
        created_at=float(row["created_at"]),
        output_chars=row["output_chars"],
        kill=kill,
        heartbeat_liveness=bool(row["heartbeat_liveness"]),
        hb_offset=int(row["hb_offset"] or 0),
        hb_at=row["hb_at"],
        watch_state=json.loads(row["watch_state"] or "{}"),
        emitter=row["emitter"],
    )


class SessionStore:
    """Queries and updates of ``registry_sessions``."""

    def __init__(self, db: StateDB, events: EventStore | None = None) -> None:
        self.db = db
        self.events = events or EventStore(db, max_pending=10_000, max_unacked=50_000)

    def insert(
        self,
        session: Session,
        *,
        dir: str,
        created_at: float,
        output_chars: int | None,
        heartbeat_liveness: bool = False,
    ) -> None:
        """Record a new session (state ``running``, before its keeper starts)."""
        with self.db.write() as conn:
            conn.execute(
                f"INSERT INTO registry_sessions ({_COLUMNS}) VALUES ({_MARKS})",  # noqa: S608
                (
                    session.id,
                    json.dumps(list(session.argv)),
                    _path_value(session.cwd),
                    session.owner.kind,
                    session.owner.id,
                    session.caller.value,
                    session.placement.value,
                    session.unit,
                    session.state.value,
                    dir,
                    session.log_path,
                    int(session.pty),
                    session.keeper_pid,
                    session.keeper_start,
                    session.worker_pid,
                    session.worker_start,
                    created_at,
                    session.started_at,
                    session.finished_at,
                    session.exit_code,
                    session.signal,
                    session.completion_reason,
                    session.total_bytes,
                    session.dropped_bytes,
                    session.timeout,
                    output_chars,
                    json.dumps(dict(session.labels)),
                    session.warning,
                    None,
                    None,
                    None,
                    int(session.notify),
                    session.heartbeat,
                    int(heartbeat_liveness),
                    0,
                    created_at,
                    watch_json(session.watch),
                    "{}",
                    None,
                    session.handoff_note,
                    str(session.handoff_from) if session.handoff_from else None,
                    None,
                    None,
                    _class_json(session.resources),
                ),
            )

    def update(self, session_id: str, change: SessionChange) -> None:
        """Apply a change to a row (no state change; use :meth:`finalize` for that)."""
        self._set(session_id, change.columns())

    def _set(self, session_id: str, fields: Mapping[str, Any]) -> None:
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self.db.write() as conn:
            conn.execute(
                f"UPDATE registry_sessions SET {assignments} WHERE id = ?",  # noqa: S608 - names are ours
                (*(_column_value(v) for v in fields.values()), session_id),
            )

    def finalize(
        self,
        session_id: str,
        compute: Callable[[StoredSession], FinalFields],
        *,
        completion: EventDraft | None = None,
        now: float = 0.0,
    ) -> tuple[bool, Event | None]:
        """Store a final state if the row is still ``running`` and, in the same transaction,
        the completion event when the session notifies. Returns whether this call did it,
        and the event it stored.

        ``compute`` gets the row as read *inside* the write transaction and returns the
        final columns, so a kill intent recorded just before is always seen (a kill racing
        the natural exit cannot leave a stale "exited"); the completion's state, code,
        signal and reason are those columns, and its note and watch summary are read here
        too (a concurrent handoff cannot be missed)."""
        with self.db.write() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM registry_sessions WHERE id = ?",  # noqa: S608
                (session_id,),
            ).fetchone()
            if row is None or row["state"] != SessionState.RUNNING.value:
                return False, None
            stored = _row_to_stored(row)
            final = compute(stored)
            fields = final.columns()
            assignments = ", ".join(f"{name} = ?" for name in fields)
            cursor = conn.execute(
                f"UPDATE registry_sessions SET {assignments}"  # noqa: S608 - names are ours
                " WHERE id = ? AND state = 'running'",
                (*(_column_value(v) for v in fields.values()), session_id),
            )
            if cursor.rowcount != 1:
                return False, None
            session = stored.session
            if completion is None or not (session.notify or session.heartbeat is not None):
                return True, None
            data = dict(completion.data)
            if session.handoff_from is not None:
                data["handoff_from"] = str(session.handoff_from)
            if session.watch:
                data["watch"] = dict(stored.watch_state)
            draft = replace(
                completion,
                state=final.state,
                exit_code=final.exit_code,
                signal=final.signal,
                completion_reason=final.completion_reason,
                note=session.handoff_note,
                data=data,
            )
            return True, self.events.insert(conn, session_id, draft, created_at=now)

    def amend_signal(self, session_id: str, signal: str) -> None:
        """Correct the signal of a final row and its completion event together (a kill that
        learned the real signal after another instance finalized)."""
        with self.db.write() as conn:
            conn.execute(
                "UPDATE registry_sessions SET signal = ? WHERE id = ?", (signal, session_id)
            )
            row = conn.execute(
                "SELECT id FROM registry_events WHERE session_id = ? AND type = 'completion'",
                (session_id,),
            ).fetchone()
            if row is not None:
                self.events.amend_signal(conn, row["id"], signal)

    def publish(
        self,
        session_id: str,
        draft: EventDraft,
        *,
        now: float,
        emitter: str | None = None,
        running: bool = True,
        mark: HeartbeatMark | WatchMark | None = None,
    ) -> Event | None:
        """Store an event for a session in one transaction, guarded by conditions on its row:
        still ``running`` (unless ``running`` is False), published by ``emitter`` (when given)
        and, for a heartbeat, the offset it started from (a compare-and-set); ``mark`` is
        written with it. None when a condition failed (nothing is written)."""
        conditions = ["id = ?"]
        params: list[Any] = [session_id]
        if running:
            conditions.append("state = 'running'")
        if emitter is not None:
            conditions.append("emitter = ?")
            params.append(emitter)
        updates: dict[str, Any] = {}
        if isinstance(mark, HeartbeatMark):
            conditions.append("hb_offset = ?")
            params.append(mark.since)
            updates = {"hb_offset": mark.offset, "hb_at": mark.at}
        elif isinstance(mark, WatchMark):
            updates = {"watch_state": mark.state}
            if mark.stopped:
                updates["notify"] = 1
        assignments = ", ".join(f"{name} = ?" for name in updates) or "id = id"
        with self.db.write() as conn:
            cursor = conn.execute(
                f"UPDATE registry_sessions SET {assignments}"  # noqa: S608 - names are ours
                f" WHERE {' AND '.join(conditions)}",
                (*updates.values(), *params),
            )
            if cursor.rowcount != 1:
                return None
            return self.events.insert(conn, session_id, draft, created_at=now)

    def claim_emitter(self, session_id: str, me: str, *, stale: str | None) -> bool:
        """Become the emitter of a running session whose emitter is none, us, or ``stale``
        (one we found dead)."""
        with self.db.write() as conn:
            cursor = conn.execute(
                "UPDATE registry_sessions SET emitter = ? WHERE id = ? AND state = 'running'"
                " AND (emitter IS NULL OR emitter = ? OR emitter = ?)",
                (me, session_id, me, stale or me),
            )
            return cursor.rowcount == 1

    def save_watch_state(self, session_id: str, *, emitter: str, state: str) -> bool:
        """Store where watching got to (JSON of the watch gate) while ``emitter`` holds the
        session's claim."""
        with self.db.write() as conn:
            cursor = conn.execute(
                "UPDATE registry_sessions SET watch_state = ? WHERE id = ? AND emitter = ?",
                (state, session_id, emitter),
            )
            return cursor.rowcount == 1

    def release_emitter(self, me: str) -> None:
        """Give up every emitter claim of ``me`` (another registry may take them over)."""
        with self.db.write() as conn:
            conn.execute("UPDATE registry_sessions SET emitter = NULL WHERE emitter = ?", (me,))

    def handoff(
        self,
        session_id: str,
        *,
        current: Owner,
        to: Owner,
        note: str,
        now: float,
        limit: int,
        draft: EventDraft,
    ) -> tuple[HandoffResult, Event | None]:
        """Change the owner of a running session owned by ``current``, record the handoff
        and publish ``draft`` to the new owner, all in one transaction (see
        :class:`HandoffResult`; the event only with ``OK``)."""
        with self.db.write() as conn:
            if self.events.handoffs_by(conn, current) >= limit:
                return HandoffResult.LIMIT, None
            cursor = conn.execute(
                "UPDATE registry_sessions SET owner_kind = ?, owner_id = ?, handoff_note = ?,"
                " handoff_from = ? WHERE id = ? AND state = 'running' AND owner_kind = ?"
                " AND owner_id = ?",
                (to.kind, to.id, note, str(current), session_id, current.kind, current.id),
            )
            if cursor.rowcount != 1:
                return HandoffResult.CHANGED, None
            self.events.record_handoff(
                conn, session_id=session_id, from_owner=current, to_owner=to, note=note, at=now
            )
            return HandoffResult.OK, self.events.insert(conn, session_id, draft, created_at=now)

    def handoffs_by(self, owner: Owner) -> int:
        """How many sessions ``owner`` handed to others."""
        with self.db.read() as conn:
            return self.events.handoffs_by(conn, owner)

    def record_kill(self, session_id: str, intent: KillIntent) -> None:
        """Remember a kill in progress (only while the session runs)."""
        with self.db.write() as conn:
            conn.execute(
                "UPDATE registry_sessions SET kill_state = ?, kill_reason = ?,"
                " kill_requested_at = ? WHERE id = ? AND state = 'running'",
                (intent.state.value, intent.reason, intent.requested_at, session_id),
            )

    def mark_signalled(self, session_id: str, at: float) -> None:
        """A kill is about to send its first signal (committed before the signal goes)."""
        with self.db.write() as conn:
            conn.execute(
                "UPDATE registry_sessions SET kill_signalled_at = ? WHERE id = ?"
                " AND state = 'running' AND kill_signalled_at IS NULL",
                (at, session_id),
            )

    def get(self, session_id: str) -> StoredSession | None:
        """The row with exactly this id."""
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM registry_sessions WHERE id = ?",  # noqa: S608
                (session_id,),
            ).fetchone()
        return None if row is None else _row_to_stored(row)

    def ids_with_prefix(self, prefix: str, limit: int = 50) -> list[str]:
        """Ids starting with ``prefix`` (which holds no LIKE wildcards: ids are [s_0-9a-f])."""
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT id FROM registry_sessions WHERE substr(id, 1, ?) = ? ORDER BY id LIMIT ?",
                (len(prefix), prefix, limit),
            ).fetchall()
        return [r[0] for r in rows]

    def sessions(self, *, include_finished: bool) -> list[StoredSession]:
        """Rows, newest first."""
        where = "" if include_finished else " WHERE state = 'running'"
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM registry_sessions{where}"  # noqa: S608
                " ORDER BY created_at DESC, id DESC"
            ).fetchall()
        return [_row_to_stored(r) for r in rows]

    def running(self) -> list[StoredSession]:
        """Rows recorded as running."""
        return self.sessions(include_finished=False)

    def by_owner(self, owner: Owner) -> StoredSession | None:
        """The newest row of ``owner`` (any state), through the owner index."""
        with self.db.read() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM registry_sessions"  # noqa: S608
                " WHERE owner_kind = ? AND owner_id = ? ORDER BY created_at DESC, id DESC"
                " LIMIT 1",
                (owner.kind, owner.id),
            ).fetchone()
        return None if row is None else _row_to_stored(row)

    def owned_running(self, owner: Owner) -> list[StoredSession]:
        """Running rows of ``owner``."""
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM registry_sessions WHERE state = 'running'"  # noqa: S608
                " AND owner_kind = ? AND owner_id = ? ORDER BY created_at, id",
                (owner.kind, owner.id),
            ).fetchall()
        return [_row_to_stored(r) for r in rows]

    def running_notifying(self) -> list[StoredSession]:
        """Running rows that will publish a completion event (``notify`` or heartbeats).

        A final row always has its completion already: it is stored in the transaction that
        made the row final."""
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM registry_sessions WHERE state = 'running'"  # noqa: S608
                " AND (notify = 1 OR heartbeat IS NOT NULL) ORDER BY created_at, id"
            ).fetchall()
        return [_row_to_stored(r) for r in rows]

    def prunable(self, *, finished_before: float, keep: int) -> list[StoredSession]:
        """Finished rows older than ``finished_before``, plus the oldest finished ones beyond
        the newest ``keep`` (see :func:`registry.store.retention.due_for_pruning`)."""
        with self.db.read() as conn:
            rows = conn.execute(
                "SELECT id, finished_at FROM registry_sessions WHERE state != 'running'"
            ).fetchall()
            due = due_for_pruning(
                ((r["id"], r["finished_at"]) for r in rows),
                finished_before=finished_before,
                keep=keep,
            )
            found = []
            for session_id in due:
                row = conn.execute(
                    f"SELECT {_COLUMNS} FROM registry_sessions WHERE id = ?",  # noqa: S608
                    (session_id,),
                ).fetchone()
                if row is not None:
                    found.append(_row_to_stored(row))
        return found

    def delete(self, session_ids: Iterable[str]) -> int:
        """Delete rows; returns how many went."""
        ids = list(session_ids)
        if not ids:
            return 0
        count = 0
        with self.db.write() as conn:
            self.events.forget_sessions(conn, ids)
            for sid in ids:
                count += conn.execute("DELETE FROM registry_sessions WHERE id = ?", (sid,)).rowcount
        return count

    def known_ids(self) -> set[str]:
        """Every id in the table."""
        with self.db.read() as conn:
            return {r[0] for r in conn.execute("SELECT id FROM registry_sessions")}


def _column_value(value: Any) -> Any:
    if isinstance(value, SessionState | Placement | CallerKind):
        return value.value
    if isinstance(value, Mapping):
        return json.dumps(dict(value))
    return value


def _path_value(path: str) -> str | bytes:
    """A working directory for its TEXT column: as text, or as its bytes (a BLOB) when it
    holds bytes that are not UTF-8 (such a name reaches Python with lone surrogates, which
    SQLite cannot take as text); :func:`_path_text` reverses both. (The state dir, and so
    every path under it, is UTF-8: see dispatcher/paths.py.)"""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(path)
    return path


def _path_text(value: str | bytes) -> str:
    return os.fsdecode(value) if isinstance(value, bytes) else value
