"""The registry's tables in the state database (component ``registry``) and their migrations.

Kept apart from the stores that use them so that opening the state database (every command
does) costs only these strings, not the registry's session and event code. New columns come as
new :class:`~registry.store.database.Migration` steps appended to :data:`COMPONENT`; never edit a
released step.
"""

from __future__ import annotations

from registry.store.database import Component, Migration

__all__ = ["COMPONENT", "V1_SCHEMA", "V2_SCHEMA"]

V1_SCHEMA = """
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

V2_SCHEMA = """
ALTER TABLE registry_sessions ADD COLUMN notify INTEGER NOT NULL DEFAULT 0;
ALTER TABLE registry_sessions ADD COLUMN heartbeat REAL;
ALTER TABLE registry_sessions ADD COLUMN heartbeat_liveness INTEGER NOT NULL DEFAULT 0;
ALTER TABLE registry_sessions ADD COLUMN hb_offset INTEGER NOT NULL DEFAULT 0;
ALTER TABLE registry_sessions ADD COLUMN hb_at REAL;
ALTER TABLE registry_sessions ADD COLUMN watch TEXT NOT NULL DEFAULT '[]';
ALTER TABLE registry_sessions ADD COLUMN watch_state TEXT NOT NULL DEFAULT '{}';
ALTER TABLE registry_sessions ADD COLUMN emitter TEXT;
ALTER TABLE registry_sessions ADD COLUMN event_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE registry_sessions ADD COLUMN handoff_note TEXT;
ALTER TABLE registry_sessions ADD COLUMN handoff_from TEXT;
ALTER TABLE registry_sessions ADD COLUMN kill_signalled_at REAL;
CREATE TABLE registry_events (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    acked_at REAL,
    state TEXT,
    exit_code INTEGER,
    signal TEXT,
    completion_reason TEXT,
    output TEXT NOT NULL DEFAULT '',
    output_cut INTEGER NOT NULL DEFAULT 0,
    log_path TEXT,
    note TEXT,
    data TEXT NOT NULL DEFAULT '{}',
    UNIQUE (session_id, seq)
);
CREATE INDEX registry_events_owner ON registry_events (owner, acked_at, position);
CREATE INDEX registry_events_acked ON registry_events (acked_at, position);
CREATE TABLE registry_handoffs (
    session_id TEXT NOT NULL,
    from_owner TEXT NOT NULL,
    to_owner TEXT NOT NULL,
    note TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX registry_handoffs_from ON registry_handoffs (from_owner);
"""

COMPONENT = Component(
    name="registry",
    migrations=[
        Migration(version=1, apply=V1_SCHEMA, note="sessions"),
        Migration(version=2, apply=V2_SCHEMA, note="events, handoffs, notification columns"),
        Migration(
            version=3,
            apply="CREATE INDEX registry_sessions_owner"
            " ON registry_sessions (owner_kind, owner_id, created_at);",
            note="sessions by owner",
        ),
        Migration(
            version=4,
            apply="ALTER TABLE registry_sessions ADD COLUMN usage TEXT;",
            note="what a finished worker used (OOM kills, peak memory, CPU time)",
        ),
        Migration(
            version=5,
            apply="ALTER TABLE registry_sessions ADD COLUMN resources TEXT;",
            note="the resource class a worker's scope got",
        ),
    ],
)
"""The registry's tables; listed in :func:`dispatcher.app.database.components`."""
