"""Status changes read back from the board's events: random boards replayed.

Every operation the board knows (add with and without parents, promote, claim, start, every way
a run ends, the worker's complete/block/review/defer, the operator's unblock, move, retry and
archive) is applied in a random order, one per second; after each, the cards per status are
noted. The store's ``status_flows`` over those seconds, counted back from now by
:func:`dispatcher.buckets.depth`, must give exactly the noted counts at the end of every second:
the rules of :func:`dispatcher.kanban.history.transition` miss no change and invent none.

The SQLite store also rolls up (:mod:`dispatcher.rollup`, with buckets of 1, 2 and 4 seconds)
whenever a ``roll`` comes up, every bucket up to a minute ahead of the operations, so later
operations write into buckets already stored: every read must still answer what counting the
rows answers (a second handle on the same database that reads no stored answer), assignee
changes included.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher import buckets
from dispatcher.app.database import open_state
from dispatcher.buckets import Window
from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.board import Board
from dispatcher.kanban.errors import KanbanError
from dispatcher.kanban.history import transition
from dispatcher.kanban.memory import MemoryBoardStore
from dispatcher.kanban.model import BlockKind, CardEdit, CardStatus, EventKind, NewCard
from dispatcher.kanban.settings import KanbanSettings
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.outcome import Outcome
from tests.support.history import ME, T0, WIDE, close, spawn

STATUSES = tuple(s.value for s in CardStatus)
ENDS = (
    Outcome.COMPLETED,
    Outcome.FAILED,
    Outcome.TEMPFAIL,
    Outcome.SPAWN_REFUSED,
    Outcome.DEFERRED,
    Outcome.CONFIG_ERROR,
    Outcome.RECLAIMED,
    Outcome.LOST,
)
OPS = (
    "add",
    "add_child",
    "promote",
    "claim",
    "spawn",
    "close",
    "complete",
    "block",
    "review",
    "defer",
    "unblock",
    "move",
    "retry",
    "archive",
    "reassign",
    "roll",
)
STEPS = (1.0, 2.0, 4.0)
"""The rollup's steps in these tests."""


def apply(store: BoardStore, op: str, pick: int, variant: int, now: float) -> None:
    """One operation on the card ``pick`` chooses, ``variant`` choosing how a run ends or where
    a card moves (nothing when it does not apply)."""
    cards = store.list_cards(include_archived=True)
    card = cards[pick % len(cards)] if cards else None
    board = Board(store, KanbanSettings())
    run = store.get_run(card.current_run_id) if card and card.current_run_id else None
    try:
        if op == "add" or card is None:
            store.add_card(NewCard(title="c", assignee="a"), now=now)
        elif op == "add_child":
            store.add_card(NewCard(title="c", assignee="a", parents=(card.id,)), now=now)
        elif op == "promote":
            store.promote(now=now)
        elif op == "claim" and card.status is CardStatus.READY and run is None:
            store.claim(card.id, now=now, claimer=ME, limits=WIDE)  # may wait: backoff
        elif op == "spawn" and run is not None and run.session_id is None:
            spawn(store, run, now)
        elif op == "close" and run is not None:
            close(store, run, ENDS[variant % len(ENDS)], now)
        elif run is not None and op in ("complete", "block", "review"):
            status = {"complete": "done", "block": "blocked", "review": "review"}[op]
            kind = BlockKind.NEEDS_INPUT if op == "block" else None
            store.worker_move(card.id, run.run_id, CardStatus(status), now=now, block_kind=kind)
        elif op == "defer" and run is not None and card.status is CardStatus.RUNNING:
            board.defer(card.id, run.run_id, until=now + 1, reason="later", now=now)
        elif op == "unblock":
            board.unblock(card.id, now=now)
        elif op == "move" and run is None:
            target = ("todo", "ready", "blocked", "review", "done")[variant % 5]
            board.move(card.id, target, now=now)
        elif op == "retry":
            board.retry(card.id, now=now)
        elif op == "archive" and run is None:
            board.archive(card.id, now=now)
        elif op == "reassign":
            store.edit_card(
                card.id, CardEdit(assignee="b" if card.assignee == "a" else "a"), now=now
            )
        elif op == "roll":
            store.roll_up(T0 + 150, spans=1000)
    except KanbanError:
        pass  # not allowed in the card's status: nothing changed


def replayed(store: BoardStore, ops: list[tuple[str, int, int]]) -> None:
    """Apply ``ops`` one a second from T0, then check the queue depth counted back from the
    store's flows against the counts noted after each."""
    noted: dict[str, list[int]] = {s: [] for s in STATUSES}
    for second, (op, pick, variant) in enumerate(ops):
        apply(store, op, pick, variant, T0 + second + 0.5)
        counts = store.status_counts()
        for status in STATUSES:
            noted[status].append(counts[CardStatus(status)])
    win = Window(start=T0, step=1.0, count=len(ops))
    now, flows = store.status_flows(win)
    assert buckets.depth(now, flows, STATUSES) == noted


OPERATIONS = st.lists(
    # Runs start and end more often than anything else happens, as on a real board.
    st.tuples(
        st.sampled_from((*OPS, "add", "claim", "claim", "close", "close", "spawn")),
        st.integers(0, 7),
        st.integers(0, 7),
    ),
    min_size=10,
    max_size=80,
)


@given(OPERATIONS)
@settings(max_examples=100, deadline=None)
def test_memory_board_history_replays_every_status(ops: list[tuple[str, int, int]]) -> None:
    replayed(MemoryBoardStore(), ops)


@given(OPERATIONS)
@settings(max_examples=15, deadline=None)
def test_sqlite_board_history_replays_every_status(ops: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as root, open_state(Path(root) / "state") as db:
        store = SqliteBoardStore(db)
        store.rollup_steps = STEPS
        replayed(store, ops)
        counted = SqliteBoardStore(db)
        counted.rollup_steps = ()
        for step in STEPS:
            win = Window(start=T0, step=step, count=int(len(ops) // step) + 1)
            for who in (None, "a", "b"):
                assert store.run_buckets(win, assignee=who) == counted.run_buckets(
                    win, assignee=who
                )
            assert store.status_flows(win) == counted.status_flows(win)


def test_transition_reads_each_kind() -> None:
    cases: list[tuple[str, dict[str, object], tuple[str, str] | None]] = [
        ("created", {"status": "todo"}, ("", "todo")),
        ("claimed", {}, ("ready", "running")),
        ("blocked", {"by": "worker"}, ("running", "blocked")),
        ("blocked", {"reason": "3 consecutive failures"}, ("ready", "blocked")),
        ("unblocked", {"status": "todo"}, ("blocked", "todo")),
        ("unblocked", {"reason": "transient block ended"}, ("blocked", "ready")),
        ("moved", {"from": "done", "to": "ready"}, ("done", "ready")),
        ("archived", {"from": "review"}, ("review", "archived")),
        ("exit_ignored", {"outcome": "deferred"}, ("ready", "running")),
        ("exit_ignored", {"outcome": "failed"}, None),
        ("spawned", {}, None),
        ("deferred", {"by": "worker"}, None),
    ]
    for kind, data, want in cases:
        assert transition(kind, data) == want, kind
    assert {k.value for k in EventKind} >= {"gave_up", "stopped", "edited"}
