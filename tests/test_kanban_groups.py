"""The claim order over random boards and groups (Hypothesis): priority first, each group's
cards in their own order, groups take turns, a group that joins late waits one round, and the
in-memory and SQLite stores agree claim for claim."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.app.database import open_state
from dispatcher.kanban.abc import BoardStore, ClaimVerdict
from dispatcher.kanban.memory import MemoryBoardStore
from dispatcher.kanban.model import Card, Limits, NewCard
from dispatcher.kanban.rules import turn_for
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant

NOW = 1_800_000_000.0
ME = Claimant(pid=1, start=1, boot=None)
WIDE = Limits(max_in_progress=10**6)
GROUPS = st.sampled_from([None, "a", "b", "c", "d"])

# A board: cards as (group, priority), added one second apart in this order.
boards = st.lists(st.tuples(GROUPS, st.integers(min_value=0, max_value=2)), max_size=40)


def fill(store: BoardStore, board: list[tuple[str | None, int]], start: float = NOW) -> list[Card]:
    cards = []
    for index, (group, priority) in enumerate(board):
        new = NewCard(title=f"c{index}", assignee="a", group=group, priority=priority)
        cards.append(store.add_card(new, now=start + index)[0])
    return cards


def claim_all(store: BoardStore, count: int | None = None) -> list[Card]:
    """Claim the next ready card again and again; the cards in the order claimed."""
    taken = []
    while count is None or len(taken) < count:
        ready = store.ready_cards(limit=1)
        if not ready:
            break
        claim = store.claim(ready[0].id, now=NOW, claimer=ME, limits=WIDE)
        assert claim.verdict is ClaimVerdict.CLAIMED
        taken.append(ready[0])
    return taken


@given(boards)
def test_priority_first_then_each_groups_own_order(board: list[tuple[str | None, int]]) -> None:
    store = MemoryBoardStore()
    added = fill(store, board)
    taken = claim_all(store)
    assert sorted(c.id for c in taken) == sorted(c.id for c in added)
    # Never a lower priority while a higher one is ready (everything was ready from the start).
    assert [c.priority for c in taken] == sorted((c.priority for c in taken), reverse=True)
    # Within a group: by priority, then in the order added.
    for group in {c.group for c in added}:
        mine = [c for c in taken if c.group == group]
        assert mine == sorted(mine, key=lambda c: (-c.priority, c.created_at))


@given(st.lists(GROUPS, max_size=40))
def test_groups_at_one_priority_take_turns(groups: list[str | None]) -> None:
    store = MemoryBoardStore()
    fill(store, [(group, 0) for group in groups])
    sizes = Counter(groups)
    seen: Counter[str | None] = Counter()
    for card in claim_all(store):
        seen[card.group] += 1
        # Round-robin: no group is two cards ahead of another that still has cards.
        for other, size in sizes.items():
            if seen[other] < size:
                assert seen[card.group] <= seen[other] + 1


@given(boards, st.integers(min_value=0, max_value=40), GROUPS)
def test_a_group_that_joins_later_is_never_starved(
    board: list[tuple[str | None, int]], claimed: int, group: str | None
) -> None:
    store = MemoryBoardStore()
    fill(store, [(g, 0) for g, _ in board])
    claim_all(store, claimed)
    mine_waiting = [c for c in store.ready_cards() if c.group == group]
    late = store.add_card(NewCard(title="late", assignee="a", group=group), now=NOW + 1000)[0]
    ready = store.ready_cards()
    ahead = ready[: [c.id for c in ready].index(late.id)]
    # Its own group's waiting cards keep their places ahead of it ...
    assert [c for c in ahead if c.group == group] == mine_waiting
    # ... and every other group gets at most one turn per round before it (a round for each
    # of those, and for this round and the next), however many cards that group has queued.
    others = Counter(c.group for c in ahead if c.group != group)
    assert all(count <= len(mine_waiting) + 2 for count in others.values())


@given(boards, st.integers(min_value=0, max_value=10), boards)
def test_memory_and_sqlite_claim_in_the_same_order(
    first: list[tuple[str | None, int]], claimed: int, second: list[tuple[str | None, int]]
) -> None:
    def run(store: BoardStore) -> list[tuple[str, str | None, int]]:
        fill(store, first)
        order = claim_all(store, claimed)
        fill(store, second, start=NOW + 100)
        order += claim_all(store)
        return [(c.title, c.group, c.turn) for c in order]

    with tempfile.TemporaryDirectory() as tmp, open_state(Path(tmp) / "state") as db:
        assert run(MemoryBoardStore()) == run(SqliteBoardStore(db))


def test_a_turn_follows_the_group_and_never_precedes_the_round() -> None:
    assert turn_for(None, 0) == 1
    assert turn_for(4, 0) == 5
    assert turn_for(None, 7) == 7
    assert turn_for(2, 7) == 7
    assert turn_for(9, 7) == 10
