"""The cron ledger's tables in the state database (component ``cron``) and their migrations.

Apart from the ledger's code so that opening the state database (every command does) costs
only these strings. New columns come as new
:class:`~registry.store.database.Migration` steps appended to :data:`COMPONENT`; never edit a
released step.
"""

from __future__ import annotations

from registry.store.database import Component, Migration

__all__ = ["COMPONENT", "DECIDED_INDEX", "RETRIES_V3", "SCHEMA_V1"]

SCHEMA_V1 = """
CREATE TABLE cron_fires (
    id INTEGER PRIMARY KEY,
    fire_key TEXT NOT NULL UNIQUE,
    job_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    nominal_wall TEXT NOT NULL,
    fold INTEGER NOT NULL DEFAULT 0,
    zone TEXT NOT NULL,
    nominal REAL NOT NULL,
    decided_at REAL NOT NULL,
    due_at REAL,
    actual REAL,
    status TEXT NOT NULL,
    outcome TEXT,
    catch_up INTEGER NOT NULL DEFAULT 0,
    jitter REAL NOT NULL DEFAULT 0,
    placement TEXT,
    session_id TEXT,
    exit_code INTEGER,
    signal TEXT,
    started_at REAL,
    ended_at REAL,
    error TEXT,
    infrastructure INTEGER NOT NULL DEFAULT 0,
    log_path TEXT,
    claimant TEXT,
    on_failure_session TEXT
);
CREATE INDEX cron_fires_job ON cron_fires (job_id, id);
CREATE INDEX cron_fires_open ON cron_fires (status, job_id) WHERE status != 'done';
CREATE INDEX cron_fires_session ON cron_fires (session_id) WHERE session_id IS NOT NULL;
CREATE TABLE cron_jobs (
    job_id TEXT PRIMARY KEY,
    watermark REAL,
    paused INTEGER,
    paused_at REAL,
    updated_at REAL NOT NULL
);
"""

RETRIES_V3 = """
ALTER TABLE cron_fires ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
ALTER TABLE cron_fires ADD COLUMN attempts INTEGER;
ALTER TABLE cron_fires ADD COLUMN retry_at REAL;
ALTER TABLE cron_fires ADD COLUMN retry_kind TEXT;
ALTER TABLE cron_fires ADD COLUMN retry_reason TEXT;
ALTER TABLE cron_fires ADD COLUMN tries TEXT NOT NULL DEFAULT '[]';
CREATE INDEX cron_fires_retry ON cron_fires (retry_at) WHERE status = 'retry';
ALTER TABLE cron_jobs ADD COLUMN paused_reason TEXT;
"""
"""A fire's tries (issue 21): the attempt, the policy's attempts, the pending retry and the
tries that ended; why dispatch paused a job itself."""

DECIDED_INDEX = "CREATE INDEX cron_fires_decided ON cron_fires (decided_at) WHERE ended_at IS NULL;"
"""Decisions that never became a worker (skipped, missed, coalesced) have no end time; the
charts count them when they were decided."""

COMPONENT = Component(
    name="cron",
    migrations=[
        Migration(version=1, apply=SCHEMA_V1, note="cron ledger and job state"),
        Migration(
            version=2,
            apply="CREATE INDEX cron_fires_ended ON cron_fires (ended_at);",
            note="fires by end time (the web's charts read a time range)",
        ),
        Migration(version=3, apply=RETRIES_V3, note="a fire's tries and retries; pause reason"),
        Migration(
            version=4,
            apply=DECIDED_INDEX,
            note="settled fires that never ran, by decision time (the web's charts)",
        ),
    ],
)
"""The cron tables, registered in :func:`dispatcher.app.database.components`."""
