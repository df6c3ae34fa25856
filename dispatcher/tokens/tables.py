"""The ``tokens`` component's table in the state database.

One row per token ever made: its digest (SHA-256 of the token text, never the text), name,
scope, times, and ``revoked_at`` once revoked (kept, so ``token list`` can say so). The cluster
database has the same table (:mod:`dispatcher.cluster.tables`). Append new steps; never edit
one.
"""

from __future__ import annotations

from registry.store.database import Component, Migration

V1 = """
CREATE TABLE web_tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    scope TEXT NOT NULL,
    digest TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    expires_at REAL,
    last_used_at REAL,
    revoked_at REAL
);
"""

COMPONENT = Component(
    name="tokens", migrations=(Migration(version=1, apply=V1, note="API tokens"),)
)
"""The API tokens' table and its migrations."""
