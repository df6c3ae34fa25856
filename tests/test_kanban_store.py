"""The board store on real SQLite: ids, idempotency, parents, compare-and-set, fences, events."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.app.database import open_state
from dispatcher.kanban.abc import ClaimVerdict
from dispatcher.kanban.model import (
    Limits,
    NewCard,
)
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant
from registry.store.database import StateDB
from scope.foundation.ids import AmbiguousId

NOW = 1_800_000_000.0
ME = Claimant(pid=1, start=1, boot=None)
WIDE = Limits(max_in_progress=100)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[StateDB]:
    with open_state(tmp_path / "state") as state:
        yield state


@pytest.fixture
def store(db: StateDB) -> SqliteBoardStore:
    return SqliteBoardStore(db)


def add(store: SqliteBoardStore, title: str = "t", **kw: object) -> str:
    card, created = store.add_card(NewCard(title=title, assignee="a", **kw), now=NOW)  # type: ignore[arg-type]
    assert created
    return card.id


def test_ambiguous_prefix_lists_candidates(db: StateDB, store: SqliteBoardStore) -> None:
    with db.write() as conn:
        for suffix in ("aa", "bb"):
            conn.execute(
                "INSERT INTO kanban_cards (id, title, assignee, status, created_at, updated_at)"
                " VALUES (?, 't', 'a', 'ready', 0, 0)",
                ("c_abcdef00" + suffix,),
            )
    with pytest.raises(AmbiguousId) as err:
        store.resolve_card("c_abcd")
    assert err.value.exit_code == 2
    assert "c_abcdef00aa" in err.value.message and "c_abcdef00bb" in err.value.message


def test_concurrent_claims_open_exactly_one_run(db: StateDB, tmp_path: Path) -> None:
    card_id = add(SqliteBoardStore(db))
    wins: list[str] = []
    barrier = threading.Barrier(4)

    def contender() -> None:
        # Separate connections: the compare-and-set must hold across writers, not a lock.
        with StateDB(db.path, db.components) as own:
            barrier.wait(timeout=5)
            claim = SqliteBoardStore(own).claim(card_id, now=NOW, claimer=ME, limits=WIDE)
            if claim.run is not None:
                wins.append(claim.run.run_id)

    threads = [threading.Thread(target=contender) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(wins) == 1
    assert len(SqliteBoardStore(db).runs_of(card_id)) == 1


def test_pause_survives_a_reopen(db: StateDB, store: SqliteBoardStore) -> None:
    card_id = add(store)
    assert store.set_paused(True) and not store.set_paused(True)
    with StateDB(db.path, db.components) as again:
        assert SqliteBoardStore(again).paused()
    assert store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).verdict is ClaimVerdict.PAUSED
    assert store.set_paused(False)
    assert store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).run is not None


def test_events_are_append_only(db: StateDB, store: SqliteBoardStore) -> None:
    card_id = add(store)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"), db.write() as conn:
        conn.execute("UPDATE kanban_events SET kind = 'x' WHERE card_id = ?", (card_id,))
    assert store.events_of(card_id)[0].kind == "created"


def test_the_walk_skips_cards_backing_off_through_an_index(
    db: StateDB, store: SqliteBoardStore
) -> None:
    from dispatcher.kanban.store import ready_query
    from dispatcher.kanban.tick import WALK_PAGE

    with db.write() as conn:
        conn.execute(
            "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < 20000)"
            " INSERT INTO kanban_cards (id, title, assignee, status, priority, created_at,"
            " updated_at, retry_at) SELECT printf('c_%010x', x), 't', 'a', 'ready', x % 2 * 5,"
            " x, x, CASE WHEN x % 2 = 1 THEN 4e9 END FROM g"
        )
        conn.execute("ANALYZE")
    sql, params = ready_query(limit=WALK_PAGE, now=2e9)
    with db.read() as conn:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    assert "SCAN kanban_cards USING INDEX kanban_cards_ready" in plan, plan
    assert any(p.startswith("SEARCH kanban_cards USING INDEX kanban_cards_retry") for p in plan)
    assert not any(p == "SCAN kanban_cards" for p in plan), plan
    page = store.ready_cards(limit=WALK_PAGE, now=2e9)
    assert len(page) == WALK_PAGE and all(c.retry_at is None for c in page)
