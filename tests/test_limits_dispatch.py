"""Named limits and groups through the real dispatcher tick and the SQLite board (FakeRegistry,
FakeScoper, FakeClock): fairness between a big and a small group, what a tick reports about
cards held by a limit, a lowered limit that stops nothing, and a full limit that ends the walk
early."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from dispatcher.app.database import open_state
from dispatcher.kanban.model import CardStatus, NewCard
from dispatcher.kanban.settings import Assignee, KanbanSettings
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.kanban.tick import WALK_PAGE, KanbanDispatcher
from dispatcher.launch.limits import LimitSpec, PerGroup, Rate
from registry.fake import FakeRegistry
from scope.abc import CallerKind
from scope.fake import FakeScoper
from scope.foundation.clock import FakeClock


@dataclass
class Rig:
    store: SqliteBoardStore
    registry: FakeRegistry
    clock: FakeClock
    state_dir: Path
    settings: KanbanSettings

    def dispatcher(self, limits: Mapping[str, LimitSpec]) -> KanbanDispatcher:
        return KanbanDispatcher(
            store=self.store,
            registry=self.registry,
            settings=self.settings,
            state_dir=self.state_dir,
            caller=CallerKind.KANBAN,
            environ={"PATH": "/usr/bin"},
            limits=limits,
        )

    def add(self, count: int, group: str | None, assignee: str = "coder") -> list[str]:
        ids = []
        for index in range(count):
            new = NewCard(title=f"{group}-{index}", assignee=assignee, group=group)
            ids.append(self.store.add_card(new, now=self.clock.time())[0].id)
            self.clock.advance(0.001)
        return ids

    def running(self) -> list[str]:
        return [c.id for c in self.store.list_cards(statuses=[CardStatus.RUNNING])]

    def finish(self, card_id: str) -> None:
        run = self.store.runs_of(card_id)[-1]
        assert run.session_id is not None
        self.registry.finish(run.session_id, exit_code=0)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    clock = FakeClock()
    scoper = FakeScoper(clock=clock)
    settings = KanbanSettings(
        max_in_progress=4,
        assignees={
            "coder": Assignee(command=("coder",), uses=("tenants",)),
            "api": Assignee(command=("api",), uses=("openai",)),
        },
    )
    with open_state(tmp_path / "state") as db:
        yield Rig(
            SqliteBoardStore(db),
            FakeRegistry(scoper=scoper, clock=clock),
            clock,
            tmp_path / "state",
            settings,
        )


@pytest.mark.parametrize(("per_group", "most"), [(2, 19), (None, 5)])
def test_a_small_group_is_not_starved_by_a_big_one(
    rig: Rig, per_group: int | None, most: int
) -> None:
    """2,000 cards in one group and 5 in another, added together; each group may run 2 at
    once and the board 4: the small group's 5 all start before the big group's 20th start.
    Without the per-group cap the turns alone do it: before the big group's 6th start."""
    caps = PerGroup(concurrency=per_group) if per_group else None
    tick = rig.dispatcher({"tenants": LimitSpec(concurrency=100, per_group=caps)})
    big = set(rig.add(2000, "big"))
    small = set(rig.add(5, "small"))
    started: list[str] = []
    while not small <= set(started):
        report = tick.tick(rig.clock.time())
        started += [d.card_id for d in report.dispatched]
        running = rig.running()
        assert len(running) <= 4
        for group in (big, small):
            assert len([c for c in running if c in group]) <= (per_group or 4)
        # Workers end one at a time, the oldest first.
        rig.finish(min(running, key=started.index))
        rig.clock.advance(1)
    big_starts = [c for c in started if c in big]
    assert len(big_starts) <= most, f"the big group started {len(big_starts)} first"


def test_a_tick_names_the_limit_its_cards_wait_for(rig: Rig) -> None:
    tick = rig.dispatcher({"openai": LimitSpec(concurrency=2, rate=Rate(starts=3, window=60))})
    cards = rig.add(4, None, assignee="api")
    first = tick.tick(rig.clock.time())
    assert len(first.dispatched) == 2
    assert [(c, w) for c, w in first.limited] == [
        (cards[2], "limit openai (2 of 2 running)"),
        (cards[3], "limit openai (2 of 2 running)"),
    ]
    assert first.to_dict()["limited"][0] == {
        "card_id": cards[2],
        "wait": "limit openai (2 of 2 running)",
    }
    rig.finish(cards[0])
    rig.clock.advance(5)
    second = tick.tick(rig.clock.time())
    assert [d.card_id for d in second.dispatched] == [cards[2]]
    rig.finish(cards[1])
    rig.clock.advance(5)
    third = tick.tick(rig.clock.time())  # 3 starts in the last minute: the rate holds it
    assert not third.dispatched
    assert third.limited == ((cards[3], "limit openai (next start in 50s)"),)
    rig.clock.advance(50)
    assert [d.card_id for d in tick.tick(rig.clock.time()).dispatched] == [cards[3]]


def test_a_lowered_limit_stops_nothing_and_holds_new_claims(rig: Rig) -> None:
    wide = rig.dispatcher({"openai": LimitSpec(concurrency=3)})
    cards = rig.add(4, None, assignee="api")
    assert len(wide.tick(rig.clock.time()).dispatched) == 3
    # A reload builds the dispatcher anew with the lowered limit.
    narrow = rig.dispatcher({"openai": LimitSpec(concurrency=1)})
    report = narrow.tick(rig.clock.time())
    assert not report.dispatched and report.limited == (
        (cards[3], "limit openai (3 of 1 running)"),
    )
    assert len(rig.running()) == 3  # nothing was stopped
    for card_id in cards[:2]:
        rig.finish(card_id)
    assert not narrow.tick(rig.clock.time()).dispatched  # 1 still running: still full
    rig.finish(cards[2])
    assert [d.card_id for d in narrow.tick(rig.clock.time()).dispatched] == [cards[3]]


def test_a_full_limit_every_assignee_uses_ends_the_walk_at_the_first_page(rig: Rig) -> None:
    rig.settings = KanbanSettings(
        max_in_progress=50, assignees={"api": Assignee(command=("api",), uses=("openai",))}
    )
    tick = rig.dispatcher({"openai": LimitSpec(concurrency=1)})
    rig.add(3 * WALK_PAGE, None, assignee="api")
    pages = []
    read = rig.store.ready_cards

    def counted(**kw: object) -> object:
        pages.append(kw)
        return read(**kw)  # type: ignore[arg-type]

    rig.store.ready_cards = counted  # type: ignore[assignment,method-assign]
    report = tick.tick(rig.clock.time())
    assert len(report.dispatched) == 1 and len(pages) == 1
    assert len(report.limited) == WALK_PAGE - 1


LIVE = """
serve:
  safety_tick: 30s
limits:
  slots: {concurrency: %d}
kanban:
  assignees:
    slow:
      command: [sleep, '60']
      uses: [slots]
"""


def test_reload_changes_a_limit_live_and_stops_nothing(tmp_path: Path) -> None:
    """A real gateway (real workers, a fake clock): lowering a limit by ``dispatch reload``
    holds new claims and leaves running workers alone; raising it lets the card start."""
    from dispatcher.app.workspace import Workspace
    from dispatcher.config import load_config
    from dispatcher.gateway.serve import Gateway
    from tests.support.env import no_bus_env

    config = tmp_path / "config.yaml"
    config.write_text(LIVE % 2)
    environ = no_bus_env(tmp_path)
    clock = FakeClock(1_800_000_000.0)
    settings = load_config(config).settings
    gateway = Gateway(
        settings=settings,
        state_dir=tmp_path / "state",
        environ=environ,
        config_path=config,
        clock=clock,
    )
    gateway.start()
    try:
        workspace = Workspace(settings, tmp_path / "state", environ=environ, clock=clock)
        try:
            cards = [
                workspace.board.add(f"c{i}", assignee="slow", now=clock.time())[0].id
                for i in range(3)
            ]
        finally:
            workspace.close()
        store = gateway._store
        assert store is not None

        def running() -> set[str]:
            return {c.id for c in store.list_cards(statuses=[CardStatus.RUNNING])}

        gateway.step(clock.monotonic(), poked=True)
        assert running() == set(cards[:2])  # the first two in claim order
        config.write_text(LIVE % 1)
        gateway.request_reload()
        gateway.step(clock.monotonic())
        assert gateway.settings.limits["slots"].concurrency == 1
        assert running() == set(cards[:2])  # nothing was stopped
        config.write_text(LIVE % 3)
        gateway.request_reload()
        gateway.step(clock.monotonic())
        assert running() == set(cards)
    finally:
        registry = gateway._runtime.registry if gateway._runtime else None
        for session in registry.list_sessions() if registry else []:
            registry.kill(session.id, reason="test over")  # type: ignore[union-attr]
        gateway.shutdown()
        gateway.close()
