"""The ``notify`` component's table in the state database: the outbox.

One row per (message, channel). Rows are written by the stores in the transaction of the event
they report (:mod:`dispatcher.launch.outbox`) and moved by the sender: ``pending`` (due at
``next_at``; ``claimed_until`` fences a delivery in flight), ``delivered`` or ``dead`` (past the
deadline counted from ``since``, which ``dispatch notify retry`` resets). The cluster database
has the same table (:mod:`dispatcher.cluster.tables`). Append new steps; never edit one.
"""

from __future__ import annotations

from registry.store.database import Component, Migration

V1 = """
CREATE TABLE notify_outbox (
    message_id TEXT NOT NULL,
    channel TEXT NOT NULL,
    event TEXT NOT NULL,
    created_at REAL NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL,
    since REAL NOT NULL,
    claimed_until REAL,
    last_error TEXT,
    delivered_at REAL,
    PRIMARY KEY (message_id, channel)
);
CREATE INDEX notify_outbox_due ON notify_outbox (state, next_at);
"""

COMPONENT = Component(
    name="notify", migrations=(Migration(version=1, apply=V1, note="the outbox"),)
)
"""The outbox's tables and their migrations."""
