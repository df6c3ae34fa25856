"""The launch core's tables in the state database (component ``limits``): the holds of named
limits (:mod:`dispatcher.launch.holds`).

Apart from the code that uses them, so that opening the state database (every command does)
costs only these strings. Append new steps; never edit a released one.
"""

from __future__ import annotations

from registry.store.database import Component, Migration

__all__ = ["COMPONENT", "HOLDS_TABLE"]

HOLDS_TABLE = """
CREATE TABLE limit_holds (
    id {id},
    limit_name {text} NOT NULL,
    holder_kind {text} NOT NULL,
    holder_id {text} NOT NULL,
    host_id {text},
    group_name {text},
    taken_at {real} NOT NULL,
    released_at {real}
);
CREATE INDEX limit_holds_open ON limit_holds (limit_name, group_name, host_id)
    WHERE released_at IS NULL;
CREATE INDEX limit_holds_taken ON limit_holds (limit_name, taken_at);
CREATE INDEX limit_holds_holder ON limit_holds (holder_kind, holder_id);
"""
"""The holds table (types filled in per database): the open holds of a limit, its starts in a
window and a holder's holds are each one index range, never a scan. Only the index that counts
open holds is partial: a second partial index on the same condition would tempt PostgreSQL's
planner to count a limit's holds through it, walking every open hold."""

OPEN_COVERING = """
DROP INDEX limit_holds_open;
CREATE INDEX limit_holds_open ON limit_holds (limit_name, group_name, host_id, released_at)
    WHERE released_at IS NULL;
"""
"""SQLite reads the table row of every entry of a partial index to test its condition again
unless the column is in the index: with ``released_at`` in it, counting a limit's open holds
reads the index alone (a claim's three counts with 36 open holds a limit: 33 to 27 µs, the
gap growing with the open holds). PostgreSQL needs no such column: its partial index implies
the condition, and its index-only scans use it."""

COMPONENT = Component(
    name="limits",
    migrations=(
        Migration(
            version=1,
            # No AUTOINCREMENT: the rowid grows anyway while the newest row stays (prune keeps
            # the recent ones), and the sequence table would cost every claim a write.
            apply=HOLDS_TABLE.format(id="INTEGER PRIMARY KEY", text="TEXT", real="REAL"),
            note="named limits' holds",
        ),
        Migration(
            version=2,
            apply=OPEN_COVERING,
            note="limit_holds_open covers the count of a limit's open holds",
        ),
    ),
)
"""The holds table in the state database (listed in :func:`dispatcher.app.database.components`)."""
