"""The board's tables in the state database (component ``kanban``) and their migrations.

Cards, their parents, runs (one per attempt), append-only events (an UPDATE is refused by a
trigger) and a small key/value table holding the pause flag and the board version. New columns
come as new :class:`~registry.store.database.Migration` steps appended to
:data:`COMPONENT`; never edit a released step.
"""

from __future__ import annotations

from registry.store.database import Component, Migration

V1 = """
CREATE TABLE kanban_cards (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    body TEXT NOT NULL DEFAULT '',
    assignee TEXT NOT NULL,
    status TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    completed_at REAL,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    failure_limit INTEGER,
    last_failure_error TEXT,
    block_kind TEXT,
    blocked_until REAL,
    current_run_id TEXT,
    idempotency_key TEXT UNIQUE,
    tempfail_count INTEGER NOT NULL DEFAULT 0,
    retry_at REAL,
    cooldown_until REAL,
    result TEXT,
    assignee_noted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX kanban_cards_pick ON kanban_cards (status, priority DESC, created_at);
CREATE TABLE kanban_parents (
    card_id TEXT NOT NULL REFERENCES kanban_cards (id),
    parent_id TEXT NOT NULL REFERENCES kanban_cards (id),
    PRIMARY KEY (card_id, parent_id)
);
CREATE INDEX kanban_parents_parent ON kanban_parents (parent_id);
CREATE TABLE kanban_runs (
    run_id TEXT PRIMARY KEY,
    card_id TEXT NOT NULL REFERENCES kanban_cards (id),
    attempt INTEGER NOT NULL,
    outcome TEXT,
    exit_code INTEGER,
    signal TEXT,
    session_id TEXT,
    placement TEXT,
    unit TEXT,
    claimed_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    error TEXT,
    infrastructure INTEGER NOT NULL DEFAULT 0,
    claimer_pid INTEGER,
    claimer_start INTEGER
);
CREATE INDEX kanban_runs_card ON kanban_runs (card_id, claimed_at);
CREATE INDEX kanban_runs_open ON kanban_runs (card_id) WHERE outcome IS NULL;
CREATE INDEX kanban_runs_session ON kanban_runs (session_id);
CREATE TABLE kanban_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    card_id TEXT NOT NULL,
    run_id TEXT,
    kind TEXT NOT NULL,
    at REAL NOT NULL,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX kanban_events_card ON kanban_events (card_id, seq);
CREATE TRIGGER kanban_events_append_only BEFORE UPDATE ON kanban_events
BEGIN
    SELECT RAISE(ABORT, 'kanban events are append-only');
END;
CREATE TABLE kanban_meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO kanban_meta (key, value) VALUES ('board_version', 0), ('paused', 0);
"""

READY_INDEXES = """
CREATE INDEX kanban_cards_ready ON kanban_cards (priority DESC, created_at, id)
    WHERE status = 'ready' AND current_run_id IS NULL AND retry_at IS NULL;
CREATE INDEX kanban_cards_retry ON kanban_cards (retry_at, id)
    WHERE status = 'ready' AND current_run_id IS NULL AND retry_at IS NOT NULL;
"""
"""The claim's walk skips cards backing off through these: the ready cards that never backed
off in pick order, and the others by the end of their back-off (issue 21)."""

HISTORY_V5 = """
ALTER TABLE kanban_runs ADD COLUMN ready_at REAL;
DROP INDEX kanban_runs_ended;
CREATE INDEX kanban_runs_closed ON kanban_runs
    (ended_at, outcome, claimed_at, started_at, ready_at, card_id) WHERE ended_at IS NOT NULL;
"""
"""When each run's card became ready (its claim stores it), and the closed runs by end time
holding every column the charts read, so a month of runs is read from the index alone. Only
closed runs are in it: claiming and starting a run never touch it."""

GROUPS = """
ALTER TABLE kanban_cards ADD COLUMN group_name TEXT;
ALTER TABLE kanban_cards ADD COLUMN turn INTEGER NOT NULL DEFAULT 0;
DROP INDEX kanban_cards_ready;
CREATE INDEX kanban_cards_ready ON kanban_cards (priority DESC, turn, created_at, id)
    WHERE status = 'ready' AND current_run_id IS NULL AND retry_at IS NULL;
CREATE INDEX kanban_cards_group ON kanban_cards (group_name, turn);
INSERT INTO kanban_meta (key, value) VALUES ('round', 0);
"""
"""Card groups (v6): the group, the card's turn in its group's queue, the claim order's index
(the ready cards that never backed off by priority, turn, age) and the board's round (the
highest turn claimed so far)."""

COMPONENT = Component(
    name="kanban",
    migrations=[
        Migration(version=1, apply=V1, note="cards, parents, runs, events, meta"),
        Migration(
            version=2,
            apply="ALTER TABLE kanban_runs ADD COLUMN claimer_boot TEXT;",
            note="the claimant's boot id",
        ),
        Migration(
            version=3,
            apply="CREATE INDEX kanban_runs_ended ON kanban_runs (ended_at);",
            note="runs by end time (the web's charts read a time range)",
        ),
        Migration(version=4, apply=READY_INDEXES, note="ready cards with and without a back-off"),
        Migration(version=5, apply=HISTORY_V5, note="runs' ready time; closed runs by end time"),
        Migration(version=6, apply=GROUPS, note="card groups and their turns"),
    ],
)
"""The kanban board's tables; listed in :func:`dispatcher.app.database.components`."""
