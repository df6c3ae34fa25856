"""Every statement a claim with limits adds (the claim order's page, a group's last turn, the
holds' counts, a release, a prune) is an index lookup on SQLite and on PostgreSQL, never a scan
of the board or of the holds: recorded while the real code runs, then EXPLAINed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.app.database import open_state
from dispatcher.cluster.board import _CLOCK, _FACTS, PgBoardStore
from dispatcher.cluster.database import ClusterDB
from dispatcher.kanban.store import SqlBoardStore
from dispatcher.launch import holds
from dispatcher.launch.holds import Holder, Taking
from dispatcher.launch.limits import LimitScope, LimitSpec, PerGroup, Rate

NOW = 1_800_000_000.0
CARDS = 20_000
WANTS = (
    ("api", LimitSpec(concurrency=5, rate=Rate(100, 60))),
    ("gpu", LimitSpec(concurrency=1, scope=LimitScope.HOST)),
    ("tenants", LimitSpec(per_group=PerGroup(concurrency=2))),
)
BIG_TABLES = ("kanban_cards", "limit_holds", "kanban_runs")


class Recording:
    """A connection that remembers every statement it runs."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.seen: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        self.seen.append((sql, tuple(parameters)))
        return self.conn.execute(sql, parameters)


class RecordingDB:
    """A database whose transactions hand out :class:`Recording` connections."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.seen: list[tuple[str, tuple[Any, ...]]] = []

    @contextlib.contextmanager
    def _wrap(self, opened: Any) -> Iterator[Recording]:
        with opened as conn:
            recording = Recording(conn)
            yield recording
            self.seen += recording.seen

    def read(self) -> Any:
        return self._wrap(self.db.read())

    def write(self) -> Any:
        return self._wrap(self.db.write())


def fill(conn: Any) -> None:
    """20,000 ready cards in 1,000 groups and a hold for each (a quarter still open)."""
    conn.execute(
        "INSERT INTO kanban_cards (id, title, assignee, status, created_at, updated_at,"
        " group_name, turn)"
        " SELECT 'c_' || substr('0000000000' || g, -10), 't', 'a', 'ready', g, g,"
        " 'g' || (g - 1000 * (g / 1000)), g / 1000 + 1 FROM counter g",
    )
    conn.execute(
        "INSERT INTO limit_holds (limit_name, holder_kind, holder_id, host_id, group_name,"
        " taken_at, released_at) SELECT CASE WHEN g - 3 * (g / 3) = 0 THEN 'api'"
        " WHEN g - 3 * (g / 3) = 1 THEN 'gpu' ELSE 'tenants' END, 'run', 'r' || g, 'h',"
        " 'g' || (g - 1000 * (g / 1000)), ? + g, CASE WHEN g - 4 * (g / 4) = 0 THEN NULL"
        " ELSE ? END FROM counter g",
        (NOW - CARDS, NOW),
    )


def exercise(conn: Any, store_db: Any, store: SqlBoardStore) -> list[tuple[str, tuple[Any, ...]]]:
    """Run what a claim with limits runs, on recording connections; the statements."""
    recording = Recording(conn)
    holds.tallies(recording, WANTS, NOW, host="h", group="g7")
    holds.tallies(recording, WANTS, NOW, host="h", every_group=True)
    taking = Taking(wants=WANTS, holder=Holder("run", "r_x"), host="h", group="g7")
    holds.try_take(recording, taking, NOW)
    holds.release(recording, Holder("run", "r_x"), NOW)
    holds.prune(recording, NOW - CARDS + 10, chunk=50)
    store._turn(recording, "g7")
    store._turn(recording, None)
    seen = recording.seen
    page = store.ready_cards(limit=256, now=NOW)  # as the tick's walk asks
    store.ready_cards(after=page[-1], limit=256, now=NOW)
    return seen + store_db.seen


def scans(plan: str) -> list[str]:
    return [line for line in plan.splitlines() if _scan(line)]


def _scan(line: str) -> bool:
    text = line.strip()
    for table in BIG_TABLES:
        if f"Seq Scan on {table}" in text:  # PostgreSQL
            return True
        sqlite_scan = text.startswith(("SCAN", "|--SCAN", "`--SCAN")) or " SCAN " in f" {text} "
        if sqlite_scan and table in text and "USING" not in text:  # SQLite: no index
            return True
    return False


def test_sqlite_plans_use_indexes(tmp_path: Path) -> None:
    with open_state(tmp_path / "state") as db:
        with db.write() as conn:
            conn.execute(
                f"CREATE TEMP TABLE counter AS WITH RECURSIVE c(g) AS (SELECT 1 UNION ALL"
                f" SELECT g + 1 FROM c WHERE g < {CARDS}) SELECT g FROM c"
            )
            fill(conn)
            conn.execute("ANALYZE")
        with db.write() as conn:
            recorder = RecordingDB(_Shared(conn))
            statements = exercise(conn, recorder, SqlBoardStore(recorder))
            plans = {
                sql: "\n".join(
                    str(row[-1])
                    for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
                )
                for sql, params in statements
                if not sql.lstrip().upper().startswith("INSERT")
            }
    assert len(plans) >= 8
    bad = {sql: plan for sql, plan in plans.items() if scans(plan)}
    assert not bad, bad
    # Counting open holds reads the partial index alone (no row per open hold).
    counts = [plan for sql, plan in plans.items() if "released_at IS NULL), (" in sql]
    assert counts and all("USING COVERING INDEX limit_holds_open" in p for p in counts), counts
    assert all("USING INDEX limit_holds_open" not in p for p in counts), counts


@pytest.mark.postgres
def test_postgres_plans_use_indexes(cluster_db: ClusterDB) -> None:
    with cluster_db.write(None) as conn:
        conn.execute(f"CREATE TEMP TABLE counter AS SELECT generate_series(1, {CARDS}) AS g")
        fill(conn)
        conn.execute("ANALYZE kanban_cards")
        conn.execute("ANALYZE limit_holds")
        recorder = RecordingDB(_Shared(conn))
        store = PgBoardStore(cluster_db)
        store.db = recorder
        statements = exercise(conn, recorder, store)
        # The claim's own counts: the limits' counts inside its facts statement.
        parts, counted = holds.counts(WANTS, 0.0, host="h", group="g7", clock=_CLOCK)
        facts = (0.0, "h", "a", "c_0000000001", "h", 1, 0.0, *counted)
        statements.append((", ".join([_FACTS, *parts]), facts))
        plans = {
            sql: "\n".join(str(row[0]) for row in conn.execute("EXPLAIN " + sql, params).fetchall())
            for sql, params in statements
            if not sql.lstrip().upper().startswith("INSERT")
        }
        conn.raw.rollback()
    assert len(plans) >= 8
    bad = {sql: plan for sql, plan in plans.items() if scans(plan)}
    assert not bad, bad


class _Shared:
    """One open transaction, handed out as every read and write (the temp table lives in it)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @contextlib.contextmanager
    def read(self) -> Iterator[Any]:
        yield self.conn

    write = read
