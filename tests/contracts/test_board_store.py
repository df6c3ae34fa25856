"""The board-store contract, run against every implementation (in memory, SQLite).

Ids, idempotency, parents, compare-and-set claims, budgets, fences, events and the board
version: what :class:`dispatcher.kanban.abc.BoardStore` promises, whatever stores the board.
Behaviour only one backend has (SQLite's append-only trigger, several connections) is tested
beside that backend (tests/test_kanban_store.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.app.database import open_state
from dispatcher.cluster.board import PgBoardStore
from dispatcher.cluster.database import ClusterDB
from dispatcher.kanban.abc import BoardStore, ClaimVerdict
from dispatcher.kanban.errors import BadCard, StaleRun, WrongStatus
from dispatcher.kanban.memory import MemoryBoardStore
from dispatcher.kanban.model import (
    BlockKind,
    CardChange,
    CardEdit,
    CardStatus,
    EventKind,
    Limits,
    NewCard,
)
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.kanban.taxonomy import Breaker, after_run
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.limits import LimitSpec, PerGroup, Rate, WaitKind
from dispatcher.launch.outcome import Outcome, Result
from dispatcher.launch.retry import Action, Backoff, Jitter, RetryPolicy, Rule
from scope.foundation.errors import NotFoundError
from scope.foundation.ids import AmbiguousId, IdTooShort

NOW = 1_800_000_000.0
ME = Claimant(pid=1, start=1, boot=None)
WIDE = Limits(max_in_progress=100)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BoardStore]:
    if request.param == "memory":
        yield MemoryBoardStore()
    elif request.param == "sqlite":
        with open_state(tmp_path / "state") as db:
            yield SqliteBoardStore(db)
    else:
        with ClusterDB(request.getfixturevalue("pg_url")) as cluster:
            cluster.migrate()
            yield PgBoardStore(cluster)


def add(store: BoardStore, title: str = "t", **kw: object) -> str:
    card, created = store.add_card(NewCard(title=title, assignee="a", **kw), now=NOW)  # type: ignore[arg-type]
    assert created
    return card.id


def test_add_stores_a_ready_card_with_a_created_event(store: BoardStore) -> None:
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


def test_idempotency_key_returns_the_existing_card(store: BoardStore) -> None:
    first, created = store.add_card(NewCard(title="x", assignee="a", idempotency_key="k"), now=NOW)
    again, created_again = store.add_card(
        NewCard(title="other", assignee="a", idempotency_key="k"), now=NOW + 1
    )
    assert created and not created_again
    assert again.id == first.id and again.title == "x"
    assert len(store.list_cards()) == 1


def test_children_wait_in_todo_until_parents_are_done(store: BoardStore) -> None:
    parent = add(store, "parent")
    child = add(store, "child", parents=(parent,))
    assert store.get_card(child).status is CardStatus.TODO
    assert store.get_card(child).parents == (parent,)
    assert store.promote(now=NOW) == []
    store.move(parent, CardStatus.DONE, now=NOW)
    assert store.promote(now=NOW) == [(child, EventKind.PROMOTED)]
    assert store.get_card(child).status is CardStatus.READY


def test_an_unknown_parent_stores_nothing(store: BoardStore) -> None:
    with pytest.raises(NotFoundError):
        store.add_card(NewCard(title="x", assignee="a", parents=("c_ffffffffff",)), now=NOW)
    assert store.list_cards() == []
    assert store.board_version() == 0


def test_prefix_resolution(store: BoardStore) -> None:
    card_id = add(store)
    assert store.resolve_card(card_id).id == card_id
    assert store.resolve_card(card_id[:6]).id == card_id
    assert store.resolve_card(card_id[2:7].upper()).id == card_id
    assert store.resolve_card(card_id[:4]).id == card_id  # 4 characters as typed
    assert store.resolve_card(f"  {card_id[:5]}\t").id == card_id
    # The one id rule (scope.foundation.ids.lookup), as for sessions: exit 2 every time.
    with pytest.raises(IdTooShort, match="at least 4 characters") as short:
        store.resolve_card(card_id[:3])
    assert short.value.exit_code == 2
    with pytest.raises(NotFoundError, match="look like c_"):
        store.resolve_card("c_xyz!")
    with pytest.raises(NotFoundError):
        store.resolve_card("c_ffffffffff" if not card_id.startswith("c_ffff") else "c_0000")
    with pytest.raises(IdTooShort):
        store.resolve_run("r_1")


def test_claim_is_compare_and_set(store: BoardStore) -> None:
    card_id = add(store)
    first = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE)
    second = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE)
    assert first.verdict is ClaimVerdict.CLAIMED and first.run is not None
    assert second.verdict is ClaimVerdict.NOT_READY and second.run is None
    card = store.get_card(card_id)
    assert card.status is CardStatus.RUNNING and card.current_run_id == first.run.run_id
    assert [r.run_id for r in store.open_runs()] == [first.run.run_id]


def test_budgets_are_checked_inside_the_claim(store: BoardStore) -> None:
    ids = [add(store, f"c{i}") for i in range(3)]
    assert store.claim(ids[0], now=NOW, claimer=ME, limits=Limits(max_in_progress=1)).run
    full = store.claim(ids[1], now=NOW, claimer=ME, limits=Limits(max_in_progress=1))
    assert full.verdict is ClaimVerdict.BUDGET
    mine = store.claim(
        ids[1], now=NOW, claimer=ME, limits=Limits(max_in_progress=9, assignee_max=1)
    )
    assert mine.verdict is ClaimVerdict.ASSIGNEE_BUDGET


def test_close_run_applies_the_decision_once(store: BoardStore) -> None:
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

    result = Result(outcome=Outcome.COMPLETED, exit_code=0)
    closed = store.close_run(run.run_id, result, decide, now=NOW + 5)
    assert closed is not None
    done_run, card = closed
    assert done_run.outcome is Outcome.COMPLETED and done_run.ended_at == NOW + 5
    assert done_run.session_id == "s_1" and done_run.unit == "u"
    assert card.status is CardStatus.DONE and card.current_run_id is None
    assert store.close_run(run.run_id, result, decide, now=NOW + 6) is None
    assert len(calls) == 1


def test_worker_commands_are_fenced_by_the_run(store: BoardStore) -> None:
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


def test_move_never_touches_a_card_with_an_open_run(store: BoardStore) -> None:
    card_id = add(store)
    store.claim(card_id, now=NOW, claimer=ME, limits=WIDE)
    with pytest.raises(WrongStatus):
        store.move(card_id, CardStatus.READY, now=NOW)
    with pytest.raises(BadCard):
        store.move(card_id, CardStatus.RUNNING, now=NOW)
    with pytest.raises(WrongStatus):
        store.archive(card_id, now=NOW)


def test_unblock_resets_counts(store: BoardStore) -> None:
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


def test_retry_cuts_a_back_off_short_and_starts_over(store: BoardStore) -> None:
    breaker = Breaker(
        retry=RetryPolicy(attempts=4, backoff=Backoff(initial=60, jitter=Jitter.NONE))
    )
    card_id = add(store)
    run = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).run
    assert run is not None
    failed = Result(outcome=Outcome.FAILED, exit_code=1, error="flaky")
    store.close_run(run.run_id, failed, lambda c, r: after_run(c, r, failed, breaker, NOW), now=NOW)
    waiting = store.get_card(card_id)
    assert (waiting.retry_at, waiting.consecutive_failures) == (NOW + 60, 1)
    before = len(store.events_of(card_id))
    card = store.retry(card_id, reason="the API is back", now=NOW + 1)
    assert (card.status, card.retry_at, card.consecutive_failures, card.tempfail_count) == (
        CardStatus.READY,
        None,
        0,
        0,
    )
    (event,) = store.events_of(card_id)[before:]
    assert event.kind == EventKind.MOVED
    assert event.data == {
        "from": "ready",
        "to": "ready",
        "by": "operator",
        "action": "retry",
        "reason": "the API is back",
        "waited_until": NOW + 60,
    }
    again = store.claim(card_id, now=NOW + 1, claimer=ME, limits=WIDE).run
    assert again is not None and again.attempt == 2
    # Compare-and-set: the card as it is now (running) decides; nothing changes.
    with pytest.raises(WrongStatus):
        store.retry(card_id, reason="r", now=NOW + 2)
    assert store.get_card(card_id).current_run_id == again.run_id


def test_retry_takes_finished_and_deferred_cards_and_refuses_one_waiting_for_nothing(
    store: BoardStore,
) -> None:
    plain = add(store)
    with pytest.raises(WrongStatus) as refused:
        store.retry(plain, reason="r", now=NOW)
    assert "runs anyway" in str(refused.value)
    assert [e.kind for e in store.events_of(plain)] == ["created"]
    deferred = add(store)
    deferral = {"by": "worker", "until": NOW + 300, "reason": None}
    store.append_event(
        deferred, EventKind.DEFERRED, deferral, now=NOW, fields={"retry_at": NOW + 300}
    )
    assert store.retry(deferred, reason="r", now=NOW).retry_at is None
    for status in (CardStatus.DONE, CardStatus.BLOCKED, CardStatus.REVIEW):
        card_id = add(store)
        store.append_event(
            card_id, EventKind.MOVED, {}, now=NOW, fields={"status": status, "completed_at": NOW}
        )
        card = store.retry(card_id, reason="again", now=NOW)
        assert (card.status, card.completed_at) == (CardStatus.READY, None)
        assert store.events_of(card_id)[-1].data["from"] == status.value
    with pytest.raises(NotFoundError):
        store.retry("c_0000000000", reason="r", now=NOW)


def test_transient_blocks_end_by_themselves(store: BoardStore) -> None:
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


def test_edit_records_the_changed_fields(store: BoardStore) -> None:
    card_id = add(store)
    card = store.edit_card(card_id, CardEdit(title="new", priority=9), now=NOW)
    assert (card.title, card.priority) == ("new", 9)
    event = store.events_of(card_id)[-1]
    assert event.kind == "edited" and event.data["fields"] == ["priority", "title"]


def test_every_change_bumps_the_board_version(store: BoardStore) -> None:
    versions = [store.board_version()]
    card_id = add(store)
    versions.append(store.board_version())
    store.claim(card_id, now=NOW, claimer=ME, limits=WIDE)
    versions.append(store.board_version())
    store.set_paused(True)
    versions.append(store.board_version())
    assert versions == sorted(set(versions))


def test_list_filters_and_hides_archived(store: BoardStore) -> None:
    low = add(store, "low", priority=1)
    high = add(store, "high", priority=5)
    gone = add(store, "gone")
    store.archive(gone, now=NOW)
    assert [c.id for c in store.list_cards()] == [high, low]
    assert {c.id for c in store.list_cards(include_archived=True)} == {high, low, gone}
    assert [c.id for c in store.list_cards(statuses=[CardStatus.ARCHIVED])] == [gone]
    assert store.list_cards(assignee="nobody") == []


def test_ambiguous_prefix_lists_candidates(store: BoardStore) -> None:
    # Two cards whose ids share their first two hex digits exist after at most 257 cards
    # (pigeonhole over 256 prefixes); random ids usually collide within a few dozen.
    by_prefix: dict[str, list[str]] = {}
    while True:
        card_id = add(store)
        twins = by_prefix.setdefault(card_id[:4], [])
        twins.append(card_id)
        if len(twins) == 2:
            break
    with pytest.raises(AmbiguousId) as err:
        store.resolve_card(twins[0][:4])
    assert err.value.exit_code == 2
    assert twins[0] in err.value.message and twins[1] in err.value.message


def test_ready_cards_come_by_priority_then_age(store: BoardStore) -> None:
    first = add(store, "first")
    urgent = add(store, "urgent", priority=9)
    store.add_card(NewCard(title="later", assignee="a"), now=NOW + 1)
    taken = add(store, "taken")
    store.claim(taken, now=NOW, claimer=ME, limits=WIDE)
    titles = [c.title for c in store.ready_cards()]
    assert titles[:2] == ["urgent", "first"] and titles[-1] == "later"
    assert urgent != first and "taken" not in titles
    # Pages in the same order: after a card, the ones behind it; at most limit of them.
    everything = store.ready_cards()
    assert [c.id for c in store.ready_cards(limit=2)] == [c.id for c in everything[:2]]
    rest = store.ready_cards(after=everything[0], limit=10)
    assert [c.id for c in rest] == [c.id for c in everything[1:]]
    assert store.ready_cards(after=everything[-1]) == []


def test_ready_cards_at_a_time_leave_out_cards_backing_off(store: BoardStore) -> None:
    def added(title: str, priority: int, age: int) -> str:
        new = NewCard(title=title, assignee="a", priority=priority)
        return store.add_card(new, now=NOW - 100 + age)[0].id

    waiting, later = added("waiting", 5, 0), added("later", 5, 1)
    due, fresh = added("due", 3, 2), added("fresh", 0, 3)
    for card_id, at in ((waiting, NOW + 60), (due, NOW - 1), (later, NOW + 30)):
        store.append_event(card_id, EventKind.EDITED, {}, now=NOW, fields={"retry_at": at})
    assert [c.id for c in store.ready_cards()] == [waiting, later, due, fresh]
    assert [c.id for c in store.ready_cards(now=NOW)] == [due, fresh]
    assert [c.id for c in store.ready_cards(now=NOW, limit=1)] == [due]
    first = store.ready_cards(now=NOW)[0]
    assert [c.id for c in store.ready_cards(now=NOW, after=first)] == [fresh]
    assert [c.id for c in store.ready_cards(now=NOW + 60)] == [waiting, later, due, fresh]
    assert store.backing_off(now=NOW, limit=10) == [later, waiting]
    assert store.backing_off(now=NOW, limit=1) == [later]
    assert store.backing_off(now=NOW + 60, limit=10) == []


def test_status_counts_and_runs_of(store: BoardStore) -> None:
    card_id = add(store)
    add(store)
    run = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).run
    assert run is not None and run.attempt == 1
    counts = store.status_counts()
    assert counts[CardStatus.RUNNING] == 1 and counts[CardStatus.READY] == 1
    assert [r.run_id for r in store.runs_of(card_id)] == [run.run_id]
    assert store.get_run(run.run_id).claimant == ME
    assert store.resolve_run(run.run_id[:6]).run_id == run.run_id
    with pytest.raises(NotFoundError):
        store.get_run("r_0000000000")


def test_a_second_attempt_counts_up(store: BoardStore) -> None:
    card_id = add(store)
    run = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).run
    assert run is not None
    back = CardChange(fields={"status": CardStatus.READY})
    store.close_run(run.run_id, Result(outcome=Outcome.TEMPFAIL), lambda c, r: back, now=NOW)
    again = store.claim(card_id, now=NOW + 1, claimer=ME, limits=WIDE).run
    assert again is not None and again.attempt == 2
    assert [r.attempt for r in store.runs_of(card_id)] == [1, 2]


def test_backoff_and_cooldown_refuse_a_claim_until_their_time(store: BoardStore) -> None:
    card_id = add(store)
    store.append_event(card_id, EventKind.EDITED, {}, now=NOW, fields={"retry_at": NOW + 10})
    assert store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).verdict is ClaimVerdict.BACKOFF
    store.append_event(
        card_id,
        EventKind.EDITED,
        {},
        now=NOW,
        fields={"retry_at": None, "cooldown_until": NOW + 10},
    )
    refused = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE)
    assert refused.verdict is ClaimVerdict.COOLDOWN
    forced = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE, ignore_cooldown=True)
    assert forced.verdict is ClaimVerdict.CLAIMED
    assert store.get_card(card_id).cooldown_until is None


def test_a_done_parent_that_was_archived_still_counts(store: BoardStore) -> None:
    parent = add(store, "parent")
    store.move(parent, CardStatus.DONE, now=NOW)
    store.archive(parent, now=NOW)
    child = add(store, "child", parents=(parent,))
    assert store.get_card(child).status is CardStatus.READY


def test_events_after_follows_the_whole_board_in_order(store: BoardStore) -> None:
    assert store.last_event_seq() == 0 and store.events_after(0) == []
    first, second = add(store, "one"), add(store, "two")
    store.edit_card(first, CardEdit(title="one!"), now=NOW + 1)
    events = store.events_after(0)
    assert [(e.card_id, e.kind) for e in events] == [
        (first, "created"),
        (second, "created"),
        (first, "edited"),
    ]
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert store.last_event_seq() == seqs[-1]
    assert [e.seq for e in store.events_after(seqs[0])] == seqs[1:]
    assert [e.seq for e in store.events_after(seqs[0], limit=1)] == seqs[1:2]
    assert store.events_after(seqs[-1]) == []


def test_outcome_counts_count_closed_runs_by_outcome_and_class(store: BoardStore) -> None:
    assert store.outcome_counts() == {}
    back = CardChange(fields={"status": CardStatus.READY})
    card_id = add(store)
    results = [
        Result(outcome=Outcome.SPAWN_REFUSED, infrastructure=True),
        Result(outcome=Outcome.FAILED, exit_code=1),
        Result(outcome=Outcome.FAILED, exit_code=2),
    ]
    for index, result in enumerate(results):
        run = store.claim(card_id, now=NOW + index, claimer=ME, limits=WIDE).run
        assert run is not None
        store.close_run(run.run_id, result, lambda c, r: back, now=NOW + index)
    store.claim(card_id, now=NOW + 9, claimer=ME, limits=WIDE)  # open: not counted
    assert store.outcome_counts() == {
        (Outcome.SPAWN_REFUSED, True): 1,
        (Outcome.FAILED, False): 2,
    }


def test_done_cards_come_a_page_at_a_time_newest_first(store: BoardStore) -> None:
    done = []
    for index in range(5):
        card_id = add(store, f"c{index}")
        store.move(card_id, CardStatus.DONE, now=NOW + index)
        done.append(card_id)
    add(store, "still ready")
    assert [c.id for c in store.done_cards(limit=3)] == done[::-1][:3]
    assert [c.id for c in store.done_cards(offset=3, limit=3)] == done[::-1][3:]
    assert store.done_cards(offset=5) == []
    assert all(c.status is CardStatus.DONE for c in store.done_cards())


def test_list_cards_can_stop_after_the_first_few(store: BoardStore) -> None:
    low = add(store, "low", priority=1)
    high = add(store, "high", priority=3)
    add(store, "lowest")
    assert [c.id for c in store.list_cards(limit=2)] == [high, low]
    assert store.list_cards(statuses=[CardStatus.READY], limit=0) == []


def test_a_retry_policy_decision_is_stored_and_honoured_by_the_claim(store: BoardStore) -> None:
    policy = RetryPolicy(
        attempts=3,
        backoff=Backoff(initial=10, factor=2, max=600, jitter=Jitter.EQUAL),
        rules=(Rule(exit_codes=((2, 2),), action=Action.FAIL),),
    )
    breaker = Breaker(retry=policy, rng=lambda: 0.0)  # equal jitter at its floor: d/2
    card_id = add(store)
    run = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).run
    assert run is not None
    failed = Result(outcome=Outcome.FAILED, exit_code=1, error="flaky")
    store.close_run(run.run_id, failed, lambda c, r: after_run(c, r, failed, breaker, NOW), now=NOW)
    card = store.get_card(card_id)
    assert (card.status, card.retry_at, card.consecutive_failures) == (
        CardStatus.READY,
        NOW + 5,
        1,
    )
    (event,) = [e for e in store.events_of(card_id) if e.kind == EventKind.FAILED]
    assert (event.data["attempt"], event.data["attempts"]) == (1, 3)
    assert event.data["reason"] == "backoff, attempt 2 of 3"
    refused = store.claim(card_id, now=NOW + 4.9, claimer=ME, limits=WIDE)
    assert refused.verdict is ClaimVerdict.BACKOFF
    run = store.claim(card_id, now=NOW + 5, claimer=ME, limits=WIDE).run
    assert run is not None and run.attempt == 2
    usage = Result(outcome=Outcome.FAILED, exit_code=2, error="usage")
    store.close_run(run.run_id, usage, lambda c, r: after_run(c, r, usage, breaker, NOW), now=NOW)
    card = store.get_card(card_id)
    assert card.status is CardStatus.BLOCKED and card.retry_at is None
    assert store.events_of(card_id)[-1].kind == EventKind.GAVE_UP


def test_a_workers_report_clears_the_time_its_defer_set(store: BoardStore) -> None:
    card_id = add(store)
    run = store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).run
    assert run is not None
    deferral = {"by": "worker", "until": NOW + 300, "reason": None}
    store.append_event(
        card_id,
        EventKind.DEFERRED,
        deferral,
        now=NOW,
        run_id=run.run_id,
        fields={"retry_at": NOW + 300},
    )
    card = store.worker_move(card_id, run.run_id, CardStatus.DONE, now=NOW + 1)
    assert (card.status, card.retry_at) == (CardStatus.DONE, None)


# -- groups and the claim order ---------------------------------------------------------------


def test_a_group_is_stored_edited_and_cleared(store: BoardStore) -> None:
    card_id = add(store, group="customer-42")
    card = store.get_card(card_id)
    assert card.group == "customer-42"
    assert store.list_cards()[0].group == "customer-42"
    assert store.events_of(card_id)[0].data["group"] == "customer-42"
    assert store.edit_card(card_id, CardEdit(group="customer-7"), now=NOW).group == "customer-7"
    assert store.events_of(card_id)[-1].data["group"] == "customer-7"
    assert store.edit_card(card_id, CardEdit(group=""), now=NOW).group is None
    assert add(store) != card_id and store.get_card(card_id).group is None


def added(store: BoardStore, title: str, at: float, **kw: object) -> str:
    new = NewCard(title=title, assignee="a", **kw)  # type: ignore[arg-type]
    return store.add_card(new, now=at)[0].id


def test_groups_take_turns_at_one_priority(store: BoardStore) -> None:
    big = [added(store, f"big{i}", NOW + i, group="big") for i in range(4)]
    small = [added(store, f"small{i}", NOW + 10 + i, group="small") for i in range(2)]
    loose = added(store, "loose", NOW + 20)
    urgent = added(store, "urgent", NOW + 30, group="big", priority=5)
    order = [c.id for c in store.ready_cards()]
    # Priority first; then the first card of every group, then the second of each, ...
    assert order[0] == urgent
    assert order[1:] == [big[0], small[0], loose, big[1], small[1], big[2], big[3]]
    assert [c.id for c in store.ready_cards(after=store.get_card(small[0]), limit=2)] == [
        loose,
        big[1],
    ]


def test_a_group_that_joins_later_waits_one_round_not_the_whole_queue(store: BoardStore) -> None:
    big = [added(store, f"big{i}", NOW + i, group="big") for i in range(6)]
    for card_id in big[:3]:
        assert store.claim(card_id, now=NOW, claimer=ME, limits=WIDE).verdict.value == "claimed"
    late = added(store, "late", NOW + 10, group="late")
    later = added(store, "later", NOW + 11, group="late")
    order = [c.id for c in store.ready_cards()]
    assert order.index(late) <= 1 and order.index(later) <= 3
    assert order.index(late) < order.index(big[4])


def test_a_promoted_child_joins_the_back_of_its_groups_queue(store: BoardStore) -> None:
    parent = add(store, "parent")
    child = added(store, "child", NOW, parents=(parent,), group="g")
    first = [added(store, f"g{i}", NOW + 1 + i, group="g") for i in range(2)]
    store.move(parent, CardStatus.DONE, now=NOW)
    store.promote(now=NOW)
    order = [c.id for c in store.ready_cards() if c.group == "g"]
    assert order == [*first, child]


# -- named limits -----------------------------------------------------------------------------


def at(store: BoardStore, when: float) -> float:
    """``when``, as the store's limit clock will read it: the caller's ``now``, or (for
    PostgreSQL, whose limits count on the database's clock) that clock moved there."""
    if isinstance(store, PgBoardStore):
        store.shift = lambda: when - time.time()
    return when


def using(**specs: LimitSpec) -> Limits:
    return Limits(max_in_progress=100, wants=tuple(specs.items()))


def finish(store: BoardStore, run_id: str, now: float) -> None:
    done = CardChange(fields={"status": CardStatus.DONE})
    store.close_run(run_id, Result(outcome=Outcome.COMPLETED), lambda c, r: done, now=now)


def test_a_concurrency_limit_holds_until_a_run_ends(store: BoardStore) -> None:
    two = using(api=LimitSpec(concurrency=2))
    cards = [add(store, f"c{i}") for i in range(3)]
    now = at(store, NOW)
    runs = [store.claim(c, now=now, claimer=ME, limits=two).run for c in cards[:2]]
    refused = store.claim(cards[2], now=now, claimer=ME, limits=two)
    assert refused.verdict is ClaimVerdict.LIMIT and refused.run is None
    assert refused.wait is not None and refused.wait.describe(now) == "limit api (2 of 2 running)"
    assert store.get_card(cards[2]).status is CardStatus.READY  # nothing was written
    seen, tallies = store.limit_tallies(two.wants, now=now)
    assert tallies["api"].in_use == 2 and abs(seen - now) < 60
    assert runs[0] is not None
    finish(store, runs[0].run_id, now)
    assert store.claim(cards[2], now=now, claimer=ME, limits=two).verdict is ClaimVerdict.CLAIMED
    # A claim without the limit never counts against it, nor is held by it.
    assert store.claim(add(store), now=now, claimer=ME, limits=WIDE).verdict.value == "claimed"


def test_limits_are_taken_all_or_none(store: BoardStore) -> None:
    free, full = LimitSpec(concurrency=5), LimitSpec(concurrency=1)
    now = at(store, NOW)
    assert store.claim(add(store), now=now, claimer=ME, limits=using(full=full)).run is not None
    both = using(free=free, full=full)
    refused = store.claim(add(store), now=now, claimer=ME, limits=both)
    assert refused.verdict is ClaimVerdict.LIMIT and refused.wait is not None
    assert refused.wait.limit == "full"
    _, tallies = store.limit_tallies(both.wants, now=now)
    assert tallies["free"].in_use == 0  # the free one was not half-taken


def test_per_group_caps_each_group_and_the_cards_without_one(store: BoardStore) -> None:
    tenants = using(tenants=LimitSpec(per_group=PerGroup(concurrency=1)))
    now = at(store, NOW)
    a1, a2 = add(store, group="a"), add(store, group="a")
    b1, loose1, loose2 = add(store, group="b"), add(store), add(store)
    for card_id in (a1, b1, loose1):
        assert store.claim(card_id, now=now, claimer=ME, limits=tenants).run is not None
    for card_id, group in ((a2, "a"), (loose2, None)):
        refused = store.claim(card_id, now=now, claimer=ME, limits=tenants)
        assert refused.wait is not None and refused.wait.kind is WaitKind.GROUP
        assert refused.wait.group == group


def test_a_rate_counts_starts_in_a_sliding_window(store: BoardStore) -> None:
    deploys = using(deploys=LimitSpec(rate=Rate(starts=2, window=300)))
    cards = [add(store, f"c{i}") for i in range(4)]
    first = store.claim(cards[0], now=at(store, NOW), claimer=ME, limits=deploys).run
    assert first is not None
    finish(store, first.run_id, NOW + 1)  # an ended run still counts as a start
    assert store.claim(cards[1], now=at(store, NOW + 100), claimer=ME, limits=deploys).run
    refused = store.claim(cards[2], now=at(store, NOW + 200), claimer=ME, limits=deploys)
    assert refused.verdict is ClaimVerdict.LIMIT and refused.wait is not None
    assert refused.wait.next_start is not None
    assert abs(refused.wait.next_start - (NOW + 300)) < 5
    assert refused.wait.describe(NOW + 200).startswith("limit deploys (next start in 1m")
    later = store.claim(cards[2], now=at(store, NOW + 301), claimer=ME, limits=deploys)
    assert later.verdict is ClaimVerdict.CLAIMED
    assert store.claim(cards[3], now=at(store, NOW + 302), claimer=ME, limits=deploys).wait


def test_released_holds_are_pruned_but_open_ones_stay(store: BoardStore) -> None:
    api = using(api=LimitSpec(concurrency=5, rate=Rate(starts=5, window=60)))
    now = at(store, NOW)
    ended = store.claim(add(store), now=now, claimer=ME, limits=api).run
    assert ended is not None and store.claim(add(store), now=now, claimer=ME, limits=api).run
    finish(store, ended.run_id, now)
    assert store.prune_holds(NOW - 1) == 0
    assert store.prune_holds(NOW + 3600) == 1
    _, tallies = store.limit_tallies(api.wants, now=at(store, NOW + 3600))
    assert tallies["api"].in_use == 1
