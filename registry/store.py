"""Durable sessions: the ``registry`` component of the state database.

Every ``dispatch`` process on the same state dir sees the same sessions, so any of them can list
sessions, read their output and finalize them. Finalizing is a compare-and-set on
``state = 'running'``: when two registry instances notice the same exit, exactly one stores the
final state (and publishes the completion).

A kill records its intent (state to record, reason, time) before it signals anything, so
whichever instance finalizes the session later records ``killed`` rather than a plain exit.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from registry.abc import Owner, Session, SessionState
from registry.state import Component, Migration, StateDB
from scope.abc import CallerKind, Placement

__all__ = ["COMPONENT", "KillIntent", "SessionStore", "StoredSession"]

_V1 = """
CREATE TABLE registry_sessions (
    id TEXT PRIMARY KEY,
    argv TEXT NOT NULL,
    cwd TEXT NOT NULL,
    owner_kind TEXT NOT NULL,
    owner_id TEXT NOT NULL,
    caller TEXT NOT NULL,
    placement TEXT NOT NULL,
    unit TEXT,
    state TEXT NOT NULL,
    dir TEXT NOT NULL,
    log_path TEXT NOT NULL,
    pty INTEGER NOT NULL DEFAULT 0,
    keeper_pid INTEGER,
    keeper_start INTEGER,
    worker_pid INTEGER,
    worker_start INTEGER,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    exit_code INTEGER,
    signal TEXT,
    completion_reason TEXT,
    total_bytes INTEGER NOT NULL DEFAULT 0,
    dropped_bytes INTEGER NOT NULL DEFAULT 0,
    timeout REAL,
    output_chars INTEGER,
    labels TEXT NOT NULL DEFAULT '{}',
    warning TEXT,
    kill_state TEXT,
    kill_reason TEXT,
    kill_requested_at REAL
);
CREATE INDEX registry_sessions_state ON registry_sessions (state, created_at);
CREATE INDEX registry_sessions_finished ON registry_sessions (finished_at);
"""

COMPONENT = Component(
    name="registry",
    migrations=[Migration(version=1, apply=_V1, note="sessions")],
)
"""The registry's tables; listed in :func:`dispatcher.database.components`."""


@dataclass(frozen=True, kw_only=True)
class KillIntent:
    """A kill in progress: what to record once the worker is gone."""

    state: SessionState
    reason: str
    requested_at: float


@dataclass(frozen=True, kw_only=True)
class StoredSession:
    """A row: the public :class:`Session` plus what only the registry needs."""

    session: Session
    dir: str
    created_at: float
    output_chars: int | None
    kill: KillIntent | None


_COLUMNS = (
    "id, argv, cwd, owner_kind, owner_id, caller, placement, unit, state, dir, log_path, pty,"
    " keeper_pid, keeper_start, worker_pid, worker_start, created_at, started_at, finished_at,"
    " exit_code, signal, completion_reason, total_bytes, dropped_bytes, timeout, output_chars,"
    " labels, warning, kill_state, kill_reason, kill_requested_at"
)

_MARKS = ", ".join("?" * 31)


def _row_to_stored(row: sqlite3.Row) -> StoredSession:
    kill = None
    if row["kill_state"]:
        kill = KillIntent(
            state=SessionState(row["kill_state"]),
            reason=row["kill_reason"] or "",
            requested_at=float(row["kill_requested_at"] or 0.0),
        )
    session = Session(
        id=row["id"],
        argv=tuple(json.loads(row["argv"])),
        cwd=row["cwd"],
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
    )
    return StoredSession(
        session=session,
        dir=row["dir"],
        created_at=float(row["created_at"]),
        output_chars=row["output_chars"],
        kill=kill,
    )


class SessionStore:
    """Queries and updates of ``registry_sessions``."""

    def __init__(self, db: StateDB) -> None:
        self.db = db

    def insert(
        self, session: Session, *, dir: str, created_at: float, output_chars: int | None
    ) -> None:
        """Record a new session (state ``running``, before its keeper starts)."""
        with self.db.write() as conn:
            conn.execute(
                f"INSERT INTO registry_sessions ({_COLUMNS}) VALUES ({_MARKS})",  # noqa: S608
                (
                    session.id,
                    json.dumps(list(session.argv)),
                    session.cwd,
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
                ),
            )

    def update(self, session_id: str, **fields: Any) -> None:
        """Set columns of a row (no state change; use :meth:`finalize` for that)."""
        if not fields:
            return
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self.db.write() as conn:
            conn.execute(
                f"UPDATE registry_sessions SET {assignments} WHERE id = ?",  # noqa: S608 - names are ours
                (*(_column_value(v) for v in fields.values()), session_id),
            )

    def finalize(self, session_id: str, **fields: Any) -> bool:
        """Store a final state if the row is still ``running``; True when this call did it."""
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self.db.write() as conn:
            cursor = conn.execute(
                f"UPDATE registry_sessions SET {assignments}"  # noqa: S608 - names are ours
                " WHERE id = ? AND state = 'running'",
                (*(_column_value(v) for v in fields.values()), session_id),
            )
            return cursor.rowcount == 1

    def record_kill(self, session_id: str, intent: KillIntent) -> None:
        """Remember a kill in progress (only while the session runs)."""
        with self.db.write() as conn:
            conn.execute(
                "UPDATE registry_sessions SET kill_state = ?, kill_reason = ?,"
                " kill_requested_at = ? WHERE id = ? AND state = 'running'",
                (intent.state.value, intent.reason, intent.requested_at, session_id),
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

    def prunable(self, *, finished_before: float, keep: int) -> list[StoredSession]:
        """Finished rows older than ``finished_before``, plus the oldest finished ones beyond
        the newest ``keep``."""
        with self.db.read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM registry_sessions WHERE state != 'running'"  # noqa: S608
                " ORDER BY finished_at DESC, id DESC"
            ).fetchall()
        found = []
        for index, row in enumerate(rows):
            finished = row["finished_at"] if row["finished_at"] is not None else 0.0
            if index >= keep or finished < finished_before:
                found.append(_row_to_stored(row))
        return found

    def delete(self, session_ids: Iterable[str]) -> int:
        """Delete rows; returns how many went."""
        ids = list(session_ids)
        if not ids:
            return 0
        count = 0
        with self.db.write() as conn:
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
