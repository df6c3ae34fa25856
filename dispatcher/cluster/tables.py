"""The cluster database's tables and their versioned migrations.

The same tables as the board and the ledger in SQLite (so ``dispatch state migrate`` copies rows
as they are), with the same column types where the shared SQL cares: epoch seconds are
``double precision`` and flags are 0/1 integers, so one query reads the same record from either
backend; the event sequence and ledger ids are identity columns.
Each step is applied once, in order, under an advisory lock, and recorded in ``dispatch_schema``;
a database whose recorded version is newer than :data:`VERSION` is refused untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher.cron.tables import DECIDED_INDEX
from dispatcher.launch.tables import HOLDS_TABLE
from dispatcher.rolluptables import POSTGRES as HISTORY_ROLLUP

BOARD = """
CREATE TABLE kanban_cards (
    id text PRIMARY KEY,
    title text NOT NULL,
    body text NOT NULL DEFAULT '',
    assignee text NOT NULL,
    status text NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    started_at double precision,
    completed_at double precision,
    consecutive_failures integer NOT NULL DEFAULT 0,
    failure_limit integer,
    last_failure_error text,
    block_kind text,
    blocked_until double precision,
    current_run_id text,
    idempotency_key text UNIQUE,
    tempfail_count integer NOT NULL DEFAULT 0,
    retry_at double precision,
    cooldown_until double precision,
    result text,
    assignee_noted integer NOT NULL DEFAULT 0
);
CREATE INDEX kanban_cards_pick ON kanban_cards (priority DESC, created_at, id)
    WHERE status = 'ready' AND current_run_id IS NULL;
CREATE INDEX kanban_cards_status ON kanban_cards (status);
CREATE TABLE kanban_parents (
    card_id text NOT NULL REFERENCES kanban_cards (id),
    parent_id text NOT NULL REFERENCES kanban_cards (id),
    position bigint GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (card_id, parent_id)
);
CREATE INDEX kanban_parents_parent ON kanban_parents (parent_id);
CREATE TABLE kanban_runs (
    run_id text PRIMARY KEY,
    card_id text NOT NULL REFERENCES kanban_cards (id),
    attempt integer NOT NULL,
    outcome text,
    exit_code integer,
    signal text,
    session_id text,
    placement text,
    unit text,
    claimed_at double precision NOT NULL,
    started_at double precision,
    ended_at double precision,
    error text,
    infrastructure integer NOT NULL DEFAULT 0,
    claimer_pid integer,
    claimer_start bigint,
    host_id text,
    epoch bigint
);
CREATE INDEX kanban_runs_card ON kanban_runs (card_id, attempt);
CREATE INDEX kanban_runs_open ON kanban_runs (card_id) WHERE outcome IS NULL;
CREATE INDEX kanban_runs_session ON kanban_runs (session_id);
CREATE TABLE kanban_events (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    card_id text NOT NULL,
    run_id text,
    kind text NOT NULL,
    at double precision NOT NULL,
    data text NOT NULL DEFAULT '{}'
);
CREATE INDEX kanban_events_card ON kanban_events (card_id, seq);
CREATE FUNCTION kanban_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'kanban events are append-only';
END $$;
CREATE TRIGGER kanban_events_append_only BEFORE UPDATE ON kanban_events
    FOR EACH ROW EXECUTE FUNCTION kanban_events_append_only();
CREATE TABLE kanban_meta (
    key text PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO kanban_meta (key, value) VALUES ('board_version', 0), ('paused', 0);
"""

LEDGER = """
CREATE TABLE cron_fires (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fire_key text NOT NULL UNIQUE,
    job_id text NOT NULL,
    kind text NOT NULL,
    nominal_wall text NOT NULL,
    fold integer NOT NULL DEFAULT 0,
    zone text NOT NULL,
    nominal double precision NOT NULL,
    decided_at double precision NOT NULL,
    due_at double precision,
    actual double precision,
    status text NOT NULL,
    outcome text,
    catch_up integer NOT NULL DEFAULT 0,
    jitter double precision NOT NULL DEFAULT 0,
    placement text,
    session_id text,
    exit_code integer,
    signal text,
    started_at double precision,
    ended_at double precision,
    error text,
    infrastructure integer NOT NULL DEFAULT 0,
    log_path text,
    claimant text,
    on_failure_session text,
    host_id text
);
CREATE INDEX cron_fires_job ON cron_fires (job_id, id);
CREATE INDEX cron_fires_open ON cron_fires (status, job_id) WHERE status != 'done';
CREATE INDEX cron_fires_session ON cron_fires (session_id) WHERE session_id IS NOT NULL;
CREATE TABLE cron_jobs (
    job_id text PRIMARY KEY,
    watermark double precision,
    paused integer,
    paused_at double precision,
    updated_at double precision NOT NULL
);
"""

HOSTS = """
CREATE TABLE hosts (
    host_id text PRIMARY KEY,
    boot_id text NOT NULL,
    version text NOT NULL,
    epoch bigint NOT NULL,
    started_at timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    lease_until timestamptz NOT NULL,
    skew double precision
);
"""

HOST_INDEXES = """
CREATE INDEX kanban_runs_host_open ON kanban_runs (host_id) WHERE outcome IS NULL;
CREATE INDEX cron_fires_host_open ON cron_fires (host_id) WHERE status != 'done';
"""
"""A host's open runs and fires: its budget, its reconcile and its rescue read only those."""

OUTBOX = """
CREATE TABLE notify_outbox (
    message_id text NOT NULL,
    channel text NOT NULL,
    event text NOT NULL,
    created_at double precision NOT NULL,
    body text NOT NULL,
    state text NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    next_at double precision NOT NULL,
    since double precision NOT NULL,
    claimed_until double precision,
    last_error text,
    delivered_at double precision,
    PRIMARY KEY (message_id, channel)
);
CREATE INDEX notify_outbox_due ON notify_outbox (state, next_at);
"""
"""The notification outbox (the SQLite ``notify`` component's table)."""

HISTORY_INDEXES = """
CREATE INDEX kanban_runs_ended ON kanban_runs (ended_at);
CREATE INDEX cron_fires_ended ON cron_fires (ended_at);
"""
"""Runs and fires by end time: the web's charts read one time range of each."""

RUN_HISTORY = """
ALTER TABLE kanban_runs ADD COLUMN ready_at double precision;
DROP INDEX kanban_runs_ended;
CREATE INDEX kanban_runs_closed ON kanban_runs
    (ended_at, outcome, claimed_at, started_at, ready_at, card_id) WHERE ended_at IS NOT NULL;
"""
"""As the SQLite board's version 5 (dispatcher/kanban/tables.py): runs' ready time, and the
closed runs by end time with every column the charts read."""

TOKENS = """
CREATE TABLE web_tokens (
    id text PRIMARY KEY,
    name text NOT NULL,
    scope text NOT NULL,
    digest text NOT NULL UNIQUE,
    created_at double precision NOT NULL,
    expires_at double precision,
    last_used_at double precision,
    revoked_at double precision
);
"""
"""The HTTP API's tokens (the SQLite ``tokens`` component's table), so every host's web
accepts them."""

RETRIES = """
ALTER TABLE cron_fires ADD COLUMN attempt integer NOT NULL DEFAULT 1;
ALTER TABLE cron_fires ADD COLUMN attempts integer;
ALTER TABLE cron_fires ADD COLUMN retry_at double precision;
ALTER TABLE cron_fires ADD COLUMN retry_kind text;
ALTER TABLE cron_fires ADD COLUMN retry_reason text;
ALTER TABLE cron_fires ADD COLUMN tries text NOT NULL DEFAULT '[]';
CREATE INDEX cron_fires_retry ON cron_fires (retry_at) WHERE status = 'retry';
ALTER TABLE cron_jobs ADD COLUMN paused_reason text;
"""
"""A fire's tries and retries, why dispatch paused a job (the SQLite cron component's v3)."""

READY_INDEXES = """
CREATE INDEX kanban_cards_ready ON kanban_cards (priority DESC, created_at, id)
    WHERE status = 'ready' AND current_run_id IS NULL AND retry_at IS NULL;
CREATE INDEX kanban_cards_retry ON kanban_cards (retry_at, id)
    WHERE status = 'ready' AND current_run_id IS NULL AND retry_at IS NOT NULL;
"""
"""Ready cards with and without a back-off (the SQLite kanban component's v4)."""

GROUPS = """
ALTER TABLE kanban_cards ADD COLUMN group_name text;
ALTER TABLE kanban_cards ADD COLUMN turn bigint NOT NULL DEFAULT 0;
DROP INDEX kanban_cards_pick;
DROP INDEX kanban_cards_ready;
CREATE INDEX kanban_cards_ready ON kanban_cards (priority DESC, turn, created_at, id)
    WHERE status = 'ready' AND current_run_id IS NULL AND retry_at IS NULL;
CREATE INDEX kanban_cards_group ON kanban_cards (group_name, turn);
INSERT INTO kanban_meta (key, value) VALUES ('round', 0);
""" + HOLDS_TABLE.format(
    id="bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY", text="text", real="double precision"
)
"""Card groups, their turns and the claim order's index (the SQLite ``kanban`` component's
v6), and the named limits' holds (the SQLite ``limits`` component)."""

MIGRATIONS: Sequence[tuple[int, str, str]] = (
    (1, "board, cron ledger and hosts", BOARD + LEDGER + HOSTS),
    (2, "open runs and fires by host", HOST_INDEXES),
    (3, "the claimant's boot id", "ALTER TABLE kanban_runs ADD COLUMN claimer_boot text;"),
    (4, "the notification outbox", OUTBOX),
    (5, "runs and fires by end time", HISTORY_INDEXES),
    (6, "the HTTP API's tokens", TOKENS),
    (7, "a fire's tries and retries; pause reason", RETRIES),
    (8, "ready cards with and without a back-off", READY_INDEXES),
    (9, "settled fires that never ran, by decision time", DECIDED_INDEX),
    (10, "runs' ready time; closed runs by end time", RUN_HISTORY),
    (11, "card groups and named limits", GROUPS),
    (12, "the history rollup, kept exact", HISTORY_ROLLUP),
)
"""(version, note, SQL) in order; append new steps, never edit a released one."""

VERSION = MIGRATIONS[-1][0]
"""The schema version this code writes and understands."""
