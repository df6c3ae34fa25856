"""The history rollup's table and the triggers that keep it exact (:mod:`dispatcher.rollup`):
the SQLite state's ``history`` component and the cluster database's migration step.

Kept apart from the rollup's logic: every command opens the state and so imports this, and
none but the history's readers needs the buckets (issue 26's short write paths).
"""

from __future__ import annotations

from collections.abc import Sequence

from registry.store.database import Component, Migration

STEPS: tuple[float, ...] = (300.0, 1800.0, 3600.0, 7200.0)
"""The steps whose buckets are rolled up: the 24 h, 7 d and 30 d charts' and the board's strip
(the 1 h chart's 15 s buckets hold an hour of rows: counted every time)."""


TABLE = """
CREATE TABLE history_rollup (
    source text NOT NULL,
    step double precision NOT NULL,
    bucket_start double precision NOT NULL,
    bucket_end double precision NOT NULL,
    answer text NOT NULL,
    PRIMARY KEY (source, step, bucket_start)
);
CREATE INDEX history_rollup_end ON history_rollup (source, bucket_end);
"""
"""The rollup's table, in words both databases read alike (SQLite: REAL and TEXT)."""


def _forget(sources: Sequence[str], at: str) -> str:
    """SQLite statements deleting the ``sources``' answers of the bucket holding ``at``."""
    return "".join(
        f"    DELETE FROM history_rollup WHERE source = '{source}'"  # noqa: S608
        f" AND bucket_end > {at} AND bucket_start <= {at};\n"
        for source in sources
    )


_FIRE_TIME = "(CASE WHEN {row}.status = 'done' THEN coalesce({row}.ended_at, {row}.decided_at) END)"
"""When a fire row counts (:func:`dispatcher.cron.history.fire_time`); NULL while it does not."""

_SQLITE_TRIGGERS = f"""
CREATE TRIGGER history_event_added AFTER INSERT ON kanban_events
BEGIN
{_forget(["flows"], "NEW.at")}END;
CREATE TRIGGER history_event_deleted AFTER DELETE ON kanban_events
BEGIN
{_forget(["flows"], "OLD.at")}END;
CREATE TRIGGER history_run_added AFTER INSERT ON kanban_runs WHEN NEW.ended_at IS NOT NULL
BEGIN
{_forget(["runs", "flows"], "NEW.ended_at")}END;
CREATE TRIGGER history_run_changed AFTER UPDATE ON kanban_runs
    WHEN NEW.ended_at IS NOT NULL OR OLD.ended_at IS NOT NULL
BEGIN
{_forget(["runs", "flows"], "NEW.ended_at")}{_forget(["runs", "flows"], "OLD.ended_at")}END;
CREATE TRIGGER history_run_deleted AFTER DELETE ON kanban_runs WHEN OLD.ended_at IS NOT NULL
BEGIN
{_forget(["runs", "flows"], "OLD.ended_at")}END;
CREATE TRIGGER history_card_reassigned AFTER UPDATE OF assignee ON kanban_cards
    WHEN OLD.assignee IS NOT NEW.assignee
BEGIN
    DELETE FROM history_rollup WHERE rowid IN (
        SELECT h.rowid FROM kanban_runs r JOIN history_rollup h ON h.source = 'runs'
        AND h.bucket_end > r.ended_at AND h.bucket_start <= r.ended_at
        WHERE r.card_id = NEW.id AND r.ended_at IS NOT NULL);
END;
CREATE TRIGGER history_fire_added AFTER INSERT ON cron_fires
BEGIN
{_forget(["fires"], _FIRE_TIME.format(row="NEW"))}END;
CREATE TRIGGER history_fire_changed AFTER UPDATE ON cron_fires
BEGIN
{_forget(["fires"], _FIRE_TIME.format(row="NEW"))}\
{_forget(["fires"], _FIRE_TIME.format(row="OLD"))}END;
CREATE TRIGGER history_fire_deleted AFTER DELETE ON cron_fires
BEGIN
{_forget(["fires"], _FIRE_TIME.format(row="OLD"))}END;
"""  # noqa: S608
SQLITE = TABLE + _SQLITE_TRIGGERS
"""The table and its triggers in the SQLite state (the ``history`` component)."""

_PG_TRIGGERS = """
CREATE FUNCTION history_forget(sources text[], at double precision) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    -- PL/pgSQL keeps this statement's plan for the session (an SQL function plans it anew at
    -- every call: most of a trigger's cost).
    DELETE FROM history_rollup
     WHERE source = ANY (sources) AND bucket_end > at AND bucket_start <= at;
END $$;
CREATE FUNCTION history_event_written() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    at double precision := CASE WHEN TG_OP = 'DELETE' THEN OLD.at ELSE NEW.at END;
BEGIN
    -- Every event appended comes here: the statement itself, not a call (half the cost).
    DELETE FROM history_rollup WHERE source = 'flows' AND bucket_end > at AND bucket_start <= at;
    RETURN NULL;
END $$;
CREATE TRIGGER history_event_written AFTER INSERT OR DELETE ON kanban_events
    FOR EACH ROW EXECUTE FUNCTION history_event_written();
CREATE FUNCTION history_run_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM history_forget(ARRAY['runs', 'flows'], OLD.ended_at);
    END IF;
    IF TG_OP <> 'DELETE' THEN
        PERFORM history_forget(ARRAY['runs', 'flows'], NEW.ended_at);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER history_run_added AFTER INSERT ON kanban_runs
    FOR EACH ROW WHEN (NEW.ended_at IS NOT NULL) EXECUTE FUNCTION history_run_written();
CREATE TRIGGER history_run_changed AFTER UPDATE ON kanban_runs
    FOR EACH ROW WHEN (NEW.ended_at IS NOT NULL OR OLD.ended_at IS NOT NULL)
    EXECUTE FUNCTION history_run_written();
CREATE TRIGGER history_run_deleted AFTER DELETE ON kanban_runs
    FOR EACH ROW WHEN (OLD.ended_at IS NOT NULL) EXECUTE FUNCTION history_run_written();
CREATE FUNCTION history_card_reassigned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM history_rollup h USING kanban_runs r
     WHERE r.card_id = NEW.id AND r.ended_at IS NOT NULL AND h.source = 'runs'
       AND h.bucket_end > r.ended_at AND h.bucket_start <= r.ended_at;
    RETURN NULL;
END $$;
CREATE TRIGGER history_card_reassigned AFTER UPDATE OF assignee ON kanban_cards
    FOR EACH ROW WHEN (OLD.assignee IS DISTINCT FROM NEW.assignee)
    EXECUTE FUNCTION history_card_reassigned();
CREATE FUNCTION history_fire_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.status = 'done' THEN
        PERFORM history_forget(ARRAY['fires'], coalesce(OLD.ended_at, OLD.decided_at));
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.status = 'done' THEN
        PERFORM history_forget(ARRAY['fires'], coalesce(NEW.ended_at, NEW.decided_at));
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER history_fire_written AFTER INSERT OR UPDATE OR DELETE ON cron_fires
    FOR EACH ROW EXECUTE FUNCTION history_fire_written();
"""
POSTGRES = TABLE + _PG_TRIGGERS
"""The same in the cluster database (a step of :data:`dispatcher.cluster.tables.MIGRATIONS`)."""

COMPONENT = Component(
    name="history",
    migrations=[Migration(version=1, apply=SQLITE, note="the history rollup, kept exact")],
)
"""The rollup in the SQLite state, after the board's and the ledger's tables it watches
(listed in :func:`dispatcher.app.database.components`)."""
