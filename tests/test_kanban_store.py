"""The board store on real SQLite: ids, idempotency, parents, compare-and-set, fences, events."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.app.database import open_state
from dispatcher.kanban.abc import ClaimVerdict
from dispatcher.kanban.errors import BadCard, StaleRun, WrongStatus
from dispatcher.kanban.model import (
    BlockKind,
    CardChange,
    CardEdit,
    CardStatus,
    Claimer,
    EventKind,
    Limits,
    NewCard,
    RunOutcome,
    RunResult,
)
from dispatcher.kanban.store import SqliteBoardStore
from registry.errors import AmbiguousId
from registry.state import StateDB
from scope.foundation.errors import NotFoundError

NOW = 1_800_000_000.0
ME = Claimer(pid=1, start=1)
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


def test_add_stores_a_ready_card_with_a_created_event(store: SqliteBoardStore) -> None:
    card_id = add(store, "hello", body="b", priority=3)
    card = store.get_card(card_id)
    assert card.id.startswith("c_") and len(card.id) == 12
    assert (card.title, card.body, card.priority, card.status) == (
        "hello",
        "b",
        3,
        CardStatus.READY,
    )
    assert [e.kind for e in store.events_of(card_id)] == ["created"]


def test_idempotency_key_returns_the_existing_card(store: SqliteBoardStore) -> None:
    first, created = store.add_card(NewCard(title="x", assignee="a", idempotency_key="k"), now=NOW)
    again, created_again = store.add_card(
        NewCard(title="other", assignee="a", idempotency_key="k"), now=NOW + 1
    )
    assert created and not created_again
    assert again.id == first.id and again.title == "x"
    assert len(store.list_cards()) == 1


def test_children_wait_in_todo_until_parents_are_done(store: SqliteBoardStore) -> None:
    parent = add(store, "parent")
    child = add(store, "child", parents=(parent,))
    assert store.get_card(child).status is CardStatus.TODO
    assert store.get_card(child).parents == (parent,)
    assert store.promote(now=NOW) == []
    store.move(parent, CardStatus.DONE, now=NOW)
    assert store.promote(now=NOW) == [(child, EventKind.PROMOTED)]
    assert store.get_card(child).status is CardStatus.READY


def test_an_unknown_parent_stores_nothing(store: SqliteBoardStore) -> None:
    with pytest.raises(NotFoundError):
        store.add_card(NewCard(title="x", assignee="a", parents=("c_ffffffffff",)), now=NOW)
    assert store.list_cards() == []
    assert store.board_version() == 0


def test_prefix_resolution(store: SqliteBoardStore) -> None:
    card_id = add(store)
    assert store.resolve_card(card_id).id == card_id
    assert store.resolve_card(card_id[:6]).id == card_id
    assert store.resolve_card(card_id[2:7].upper()).id == card_id
    assert store.resolve_card(card_id[:4]).id == card_id  # 4 characters as typed
    with pytest.raises(BadCard, match="too short"):
        store.resolve_card(card_id[:3])
    with pytest.raises(BadCard, match="look like"):
        store.resolve_card("c_xyz!")
    with pytest.raises(NotFoundError):
        store.resolve_card("c_ffffffffff" if not card_id.startswith("c_ffff") else "c_0000")


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


def test_claim_is_compare_and_set(store: SqliteBoardStore) -> None:
    card_id = add(store)
    first = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE)
    second = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE)
    assert first.verdict is ClaimVerdict.CLAIMED and first.run is not None
    assert second.verdict is ClaimVerdict.NOT_READY and second.run is None
    card = store.get_card(card_id)
    assert card.status is CardStatus.RUNNING and card.current_run_id == first.run.run_id
    assert [r.run_id for r in store.open_runs()] == [first.run.run_id]


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


def test_budgets_are_checked_inside_the_claim(store: SqliteBoardStore) -> None:
    ids = [add(store, f"c{i}") for i in range(3)]
    assert store.claim(ids[0], now=NOW, claimer=ME, limits=Limits(max_in_progress=1)).run
    full = store.claim(ids[1], now=NOW, claimer=ME, limits=Limits(max_in_progress=1))
    assert full.verdict is ClaimVerdict.BUDGET
    mine = store.claim(
        ids[1], now=NOW, claimer=ME, limits=Limits(max_in_progress=9, assignee_max=1)
    )
    assert mine.verdict is ClaimVerdict.ASSIGNEE_BUDGET


def test_pause_survives_a_reopen(db: StateDB, store: SqliteBoardStore) -> None:
    card_id = add(store)
    assert store.set_paused(True) and not store.set_paused(True)
    with StateDB(db.path, db.components) as again:
        assert SqliteBoardStore(again).paused()
    assert store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).verdict is ClaimVerdict.PAUSED
    assert store.set_paused(False)
    assert store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).run is not None


def test_close_run_applies_the_decision_once(store: SqliteBoardStore) -> None:
    card_id = add(store)
    run = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).run
    assert run is not None
    assert store.record_spawn(run.run_id, session_id="s_1", placement="scoped", unit="u", now=NOW)
    assert not store.record_spawn(
        run.run_id, session_id="s_2", placement="scoped", unit=None, now=NOW
    )
    calls = []

    def decide(card: object, current: object) -> CardChange:
        calls.append(1)
        return CardChange(fields={"status": CardStatus.DONE}, events=((EventKind.COMPLETED, {}),))

    result = RunResult(outcome=RunOutcome.COMPLETED, exit_code=0)
    closed = store.close_run(run.run_id, result, decide, now=NOW + 5)
    assert closed is not None
    done_run, card = closed
    assert done_run.outcome is RunOutcome.COMPLETED and done_run.ended_at == NOW + 5
    assert done_run.session_id == "s_1" and done_run.unit == "u"
    assert card.status is CardStatus.DONE and card.current_run_id is None
    assert store.close_run(run.run_id, result, decide, now=NOW + 6) is None
    assert len(calls) == 1


def test_worker_commands_are_fenced_by_the_run(store: SqliteBoardStore) -> None:
    card_id = add(store)
    run = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).run
    assert run is not None
    before = store.board_version()
    with pytest.raises(StaleRun) as err:
        store.worker_move(card_id, "r_0000000000", CardStatus.DONE, now=NOW)
    assert err.value.exit_code == 2
    assert store.board_version() == before
    card = store.worker_move(
        card_id,
        run.run_id,
        CardStatus.BLOCKED,
        now=NOW,
        block_kind=BlockKind.NEEDS_INPUT,
        reason="which db?",
    )
    assert card.status is CardStatus.BLOCKED and card.block_kind is BlockKind.NEEDS_INPUT
    with pytest.raises(WrongStatus):
        store.worker_move(card_id, run.run_id, CardStatus.DONE, now=NOW)


def test_move_never_touches_a_card_with_an_open_run(store: SqliteBoardStore) -> None:
    card_id = add(store)
    store.claim(card_id, now=NOW, claimer=ME, limits=WIDE)
    with pytest.raises(WrongStatus):
        store.move(card_id, CardStatus.READY, now=NOW)
    with pytest.raises(BadCard):
        store.move(card_id, CardStatus.RUNNING, now=NOW)
    with pytest.raises(WrongStatus):
        store.archive(card_id, now=NOW)


def test_unblock_resets_counts(store: SqliteBoardStore) -> None:
    card_id = add(store)
    store.append_event(
        card_id,
        EventKind.BLOCKED,
        {},
        now=NOW,
        fields={"status": CardStatus.BLOCKED, "consecutive_failures": 2, "tempfail_count": 4},
    )
    card = store.unblock(card_id, now=NOW)
    assert (card.status, card.consecutive_failures, card.tempfail_count) == (
        CardStatus.READY,
        0,
        0,
    )
    with pytest.raises(WrongStatus):
        store.unblock(card_id, now=NOW)


def test_transient_blocks_end_by_themselves(store: SqliteBoardStore) -> None:
    card_id = add(store)
    store.append_event(
        card_id,
        EventKind.BLOCKED,
        {},
        now=NOW,
        fields={
            "status": CardStatus.BLOCKED,
            "block_kind": BlockKind.TRANSIENT,
            "blocked_until": NOW + 300,
        },
    )
    assert store.promote(now=NOW + 299) == []
    assert store.promote(now=NOW + 300) == [(card_id, EventKind.UNBLOCKED)]
    assert store.get_card(card_id).status is CardStatus.READY


def test_edit_records_the_changed_fields(store: SqliteBoardStore) -> None:
    card_id = add(store)
    card = store.edit_card(card_id, CardEdit(title="new", priority=9), now=NOW)
    assert (card.title, card.priority) == ("new", 9)
    event = store.events_of(card_id)[-1]
    assert event.kind == "edited" and event.data["fields"] == ["priority", "title"]


def test_events_are_append_only(db: StateDB, store: SqliteBoardStore) -> None:
    card_id = add(store)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"), db.write() as conn:
        conn.execute("UPDATE kanban_events SET kind = 'x' WHERE card_id = ?", (card_id,))
    assert store.events_of(card_id)[0].kind == "created"


def test_every_change_bumps_the_board_version(store: SqliteBoardStore) -> None:
    versions = [store.board_version()]
    card_id = add(store)
    versions.append(store.board_version())
    store.claim(card_id, now=NOW, claimer=ME, limits=WIDE)
    versions.append(store.board_version())
    store.set_paused(True)
    versions.append(store.board_version())
    assert versions == sorted(set(versions))


def test_list_filters_and_hides_archived(store: SqliteBoardStore) -> None:
    low = add(store, "low", priority=1)
    high = add(store, "high", priority=5)
    gone = add(store, "gone")
    store.archive(gone, now=NOW)
    assert [c.id for c in store.list_cards()] == [high, low]
    assert {c.id for c in store.list_cards(include_archived=True)} == {high, low, gone}
    assert [c.id for c in store.list_cards(statuses=[CardStatus.ARCHIVED])] == [gone]
    assert store.list_cards(assignee="nobody") == []
