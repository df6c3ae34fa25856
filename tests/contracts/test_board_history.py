"""The board store's history and search reads, over every implementation (in memory, SQLite,
PostgreSQL): the numbers of :func:`tests.support.history.seed_small`, worked out by hand in its
docstring, and the search syntax's promises."""

from __future__ import annotations

from dispatcher import buckets, rollup
from dispatcher.buckets import Bucket, Spread, Window
from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.memory import MemoryBoardStore
from dispatcher.kanban.model import CardEdit, CardStatus, NewCard
from dispatcher.kanban.search import CardQuery, SortKey, parse
from dispatcher.launch.outcome import Outcome
from tests.contracts.test_board_store import store
from tests.support.history import T0, WINDOW, close, run_once, seed_small

__all__ = ["store"]


def one(value: float) -> Spread:
    return Spread(1, (value, value, value))


def test_run_buckets_count_outcomes_and_spread_wait_and_run_time(store: BoardStore) -> None:
    runs = seed_small(store).runs
    # A claim stores when its card last became ready: created, or its failure at +70.
    assert [runs[n].ready_at for n in ("alpha", "beta1", "beta2")] == [T0, T0 + 5, T0 + 70]
    assert store.run_buckets(WINDOW) == [
        Bucket({"completed": 1}, {"wait": one(12.0), "run": one(18.0)}),
        Bucket({"failed": 1}, {"wait": one(20.0), "run": one(45.0)}),
        Bucket({"tempfail": 1, "spawn_refused": 1}, {"wait": one(34.0), "run": one(26.0)}),
    ]
    mine = store.run_buckets(WINDOW, assignee="a")
    assert [b.counts for b in mine] == [{"completed": 1}, {}, {"spawn_refused": 1}]
    assert mine[2].spreads == {"wait": Spread(), "run": Spread()}
    # A window after the runs holds none of them; one bucket covering all holds all four.
    assert all(b.total == 0 for b in store.run_buckets(Window(T0 + 600, 60.0, 2)))
    assert store.run_buckets(Window(T0, 180.0, 1))[0].spreads["run"] == Spread(
        3, (26.0, 45.0, 45.0)
    )


def test_spreads_take_the_nearest_rank(store: BoardStore) -> None:
    card, _ = store.add_card(NewCard(title="many", assignee="a"), now=T0)
    lengths = [7.0, 1.0, 9.0, 3.0, 5.0, 2.0, 8.0, 4.0, 6.0, 10.0]
    at = T0
    for length in lengths:
        run_once(store, card.id, claimed=at + 1, started=at + 1, ended=at + 1 + length)
        store.move(card.id, CardStatus.READY, now=at + 1 + length)
        at += 12
    (bucket,) = store.run_buckets(Window(T0, 300.0, 1))
    assert bucket.spreads["run"] == Spread(10, (5.0, 9.0, 10.0))
    assert bucket.spreads["run"] == Spread.of(lengths)


def test_status_flows_count_back_to_the_queue_depth(store: BoardStore) -> None:
    seed_small(store)
    counts, flows = store.status_flows(WINDOW)
    assert (counts["ready"], counts["running"], counts["done"], counts["blocked"]) == (2, 1, 1, 0)
    assert flows == [
        {("", "ready"): 2, ("ready", "running"): 2, ("running", "done"): 1},
        {("running", "ready"): 1, ("ready", "running"): 1},
        {("running", "ready"): 2, ("", "ready"): 2, ("ready", "running"): 2},
    ]
    depth = buckets.depth(counts, flows, ("ready", "running", "blocked"))
    assert depth == {"ready": [0, 0, 2], "running": [1, 1, 1], "blocked": [0, 0, 0]}


def test_status_flows_see_blocks_moves_and_a_deferred_close(store: BoardStore) -> None:
    card, _ = store.add_card(NewCard(title="x", assignee="a"), now=T0)
    for at in (T0 + 1, T0 + 3):
        run_once(store, card.id, claimed=at, started=at, ended=at + 1, outcome=Outcome.FAILED)
    # The third counted failure trips the breaker: blocked.
    run_once(store, card.id, claimed=T0 + 5, started=T0 + 5, ended=T0 + 6, outcome=Outcome.FAILED)
    assert store.get_card(card.id).status is CardStatus.BLOCKED
    store.unblock(card.id, now=T0 + 70)
    store.move(card.id, CardStatus.REVIEW, now=T0 + 71)
    store.move(card.id, CardStatus.READY, now=T0 + 72)
    run = run_once(store, card.id, claimed=T0 + 80, started=T0 + 80, ended=None)
    close(store, run, Outcome.DEFERRED, T0 + 130)
    assert store.get_card(card.id).status is CardStatus.READY
    counts, flows = store.status_flows(WINDOW)
    depth = buckets.depth(counts, flows, ("ready", "running", "blocked", "review"))
    # At the end of each minute: blocked, then running again (after review and ready), then
    # ready after the deferred run (its close has no event; its run row says so).
    assert depth == {
        "ready": [0, 0, 1],
        "running": [0, 1, 0],
        "blocked": [1, 0, 0],
        "review": [0, 0, 0],
    }
    assert flows[2] == {("running", "ready"): 1}


def test_runs_in_a_bar_and_on_a_timeline(store: BoardStore) -> None:
    seeded = seed_small(store)
    runs = seeded.runs

    def ids(lines: list) -> list[str]:  # type: ignore[type-arg]
        return [line.run.run_id for line in lines]

    ended = store.runs_in(T0 + 60, T0 + 180, ended=True)
    assert ids(ended) == [runs[n].run_id for n in ("beta1", "beta2", "gamma")]
    assert (ended[0].assignee, ended[0].title) == ("b", "Beta DB migration")
    assert ids(store.runs_in(T0 + 60, T0 + 180, ended=True, outcome="failed")) == [
        runs["beta1"].run_id
    ]
    assert ids(store.runs_in(T0, T0 + 180, ended=True, assignee="a")) == [
        runs["alpha"].run_id,
        runs["gamma"].run_id,
    ]
    assert ids(store.runs_in(T0, T0 + 180, ended=True, limit=1)) == [runs["alpha"].run_id]
    assert ids(store.runs_in(T0 + 100, T0 + 110)) == [runs["beta2"].run_id]
    open_now = store.runs_in(T0 + 150, T0 + 200)
    assert ids(open_now) == [runs["gamma"].run_id, runs["delta"].run_id]
    assert open_now[1].run.open and open_now[1].run.started_at == T0 + 165


def test_search_by_each_field(store: BoardStore) -> None:
    seeded = seed_small(store)
    c = seeded.cards
    archived, _ = store.add_card(NewCard(title="old delta", assignee="a"), now=T0)
    store.archive(archived.id, now=T0 + 1)

    def found(text: str, **kw: object) -> list[str]:
        page = store.search_cards(parse(text, now=T0 + 200, **kw))  # type: ignore[arg-type]
        return [card.id for card in page.cards]

    assert found("db") == [c["beta"]]  # case is ignored
    assert found('"db migration" beta') == [c["beta"]]
    assert found("delta") == [c["delta"]]  # archived cards stay out
    assert found("delta status:archived") == [archived.id]
    assert found(c["alpha"][:6]) == [c["alpha"]]
    assert found(f"id:{c['alpha'][2:7].upper()}") == [c["alpha"]]
    assert set(found("assignee:a")) == {c["alpha"], c["gamma"]}
    assert found("status:done") == [c["alpha"]]
    assert set(found("status:ready,running a:b")) == {c["beta"], c["delta"]}
    # Last changed within 60 s of T0 + 200: gamma (150), delta (165).
    assert set(found("changed:60s")) == {c["gamma"], c["delta"]}
    assert set(found("created:71s")) == {c["gamma"], c["delta"]}
    assert found("group:nightly") == []
    grouped, _ = store.add_card(NewCard(title="grouped", assignee="a", group="nightly"), now=T0)
    assert found("group:nightly") == [grouped.id]
    assert found("grouped group:other") == []
    spaced, _ = store.add_card(NewCard(title="s", assignee="a", group="night shift"), now=T0)
    assert found('group:"night shift"') == [spaced.id]
    assert found("group:night") == []  # the whole name, not a part of it


def test_search_sorts_and_pages(store: BoardStore) -> None:
    seeded = seed_small(store)
    c = seeded.cards
    by_title = [c["beta"], c["alpha"], c["delta"], c["gamma"]]  # byte order: "B" < "a"
    query = CardQuery(sort=SortKey.TITLE, descending=False, limit=3)
    first = store.search_cards(query)
    assert ([card.id for card in first.cards], first.total) == (by_title[:3], 4)
    rest = store.search_cards(query.page(3))
    assert ([card.id for card in rest.cards], rest.total) == (by_title[3:], 4)
    newest = store.search_cards(CardQuery(sort=SortKey.CREATED))
    assert [card.id for card in newest.cards] == [c["delta"], c["gamma"], c["beta"], c["alpha"]]
    assert (
        store.search_cards(CardQuery(sort=SortKey.STATUS, descending=False)).cards[0].id
        == (
            c["alpha"]  # done < ready < running
        )
    )


# -- the rollup (dispatcher/rollup.py): stored answers change nothing a read answers --------

ROLLED = Window(start=T0, step=300.0, count=3)
"""seed_small's three buckets at the 24-hour chart's step, which is rolled up."""
LATER = T0 + 7200 + rollup.SETTLE
"""When the first two hours from T0 have settled."""


def answers(store: BoardStore) -> list[object]:
    """Every rolled-up read of the first two hours, whole and per assignee."""
    found: list[object] = []
    for step in rollup.STEPS:
        win = Window(start=T0, step=step, count=int(7200 // step))
        found += [store.run_buckets(win, assignee=who) for who in (None, "a", "b")]
        found.append(store.status_flows(win))
    return found


def test_a_rolled_up_history_answers_as_its_rows_do(store: BoardStore) -> None:
    seed_small(store, step=300.0)
    before = answers(store)
    stored = store.roll_up(LATER)
    # Two hours of each step (24 + 4 + 2 + 1 buckets), of runs and of status changes, and the
    # two hours before the first event (a margin for clocks).
    assert stored == (0 if isinstance(store, MemoryBoardStore) else 2 * 2 * 31)
    assert store.roll_up(LATER) == 0
    assert answers(store) == before
    assert store.run_buckets(ROLLED)[0] == Bucket(
        {"completed": 1}, {"wait": one(60.0), "run": one(90.0)}
    )


def late_writes(store: BoardStore, cards: dict[str, str]) -> None:
    """Writes into buckets long settled, each touching other buckets: a card added and run in
    the second five minutes (its run failed: wait 15, run 15), gamma (whose run ended in the
    third) given to b, beta moved to review in the sixth. Each is written after events of a
    later time, but less than :data:`~dispatcher.kanban.sqlhistory.SKEW` later."""
    card, _ = store.add_card(NewCard(title="late", assignee="b"), now=T0 + 560)
    run_once(store, card.id, claimed=T0 + 570, started=T0 + 575, ended=T0 + 590,
             outcome=Outcome.FAILED)  # fmt: skip
    store.edit_card(cards["gamma"], CardEdit(assignee="b"), now=T0 + 7000)
    store.move(cards["beta"], CardStatus.REVIEW, now=T0 + 1600)


def test_writes_into_rolled_up_buckets_are_counted(store: BoardStore) -> None:
    memory = MemoryBoardStore()
    seeded = {s: seed_small(s, step=300.0) for s in (store, memory)}
    store.roll_up(LATER)
    for s in (store, memory):
        late_writes(s, seeded[s].cards)
    assert answers(store) == answers(memory)
    second = store.run_buckets(ROLLED)[1]
    assert second.counts == {"failed": 2}
    assert second.spreads["run"] == Spread(2, (15.0, 225.0, 225.0))
    assert store.run_buckets(ROLLED, assignee="a")[2].counts == {}
    # Stored again, the answers stay what the rows say.
    store.roll_up(LATER)
    assert answers(store) == answers(memory)
