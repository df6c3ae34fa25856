"""The live hub of dispatch web on an in-memory board: what it publishes, when a stream may catch
up, and that a shared render happens once however many streams ask at the same moment."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from dispatcher.kanban.memory import MemoryBoardStore
from dispatcher.kanban.model import NewCard
from dispatcher.web.live import Hub

NOW = 1_800_000_000.0


class SlowStore(MemoryBoardStore):
    """A board whose first version read takes a while (a slow first look of the hub)."""

    def __init__(self) -> None:
        super().__init__()
        self.first_read_done = threading.Event()
        self.reads = 0

    def board_version(self) -> int:
        self.reads += 1
        if self.reads == 1:
            time.sleep(0.2)  # the slowness under test, not a wait for a condition
            version = super().board_version()
            self.first_read_done.set()
            return version
        return super().board_version()


class FakeSource:
    def __init__(self) -> None:
        self.store = SlowStore()

    def refresh(self) -> None:
        return None

    def gateway_running(self) -> bool:
        return True


def _add(store: MemoryBoardStore, title: str) -> str:
    card, _ = store.add_card(NewCard(title=title, assignee="a"), now=NOW)
    return card.id


def test_a_stream_catches_up_only_after_the_hub_has_its_starting_point() -> None:
    source = FakeSource()
    hub = Hub(source, interval=0.01)  # type: ignore[arg-type]

    async def scenario() -> None:
        async with hub.stream():
            # Whatever this stream reads from the store now is at or after the hub's start:
            # nothing committed in between can fall into neither.
            assert source.store.first_read_done.is_set()
        await hub.close()

    asyncio.run(scenario())


def test_new_events_become_one_change_each_look() -> None:
    source = FakeSource()
    hub = Hub(source, interval=0.01)  # type: ignore[arg-type]
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with hub.stream() as gen:
            first = _add(source.store, "one")
            second = _add(source.store, "two")
            deadline = time.monotonic() + 10
            changes: list[Any] = []
            while time.monotonic() < deadline and not changes:
                newer = await hub.next(gen, 1.0)
                changes = [c for c in hub.changes_since(gen) or [] if c.events]
                gen = newer
            found["cards"] = [e.card_id for c in changes for e in c.events]
            found["expected"] = [first, second]
            found["counts"] = changes[-1].counts if changes else {}
        await hub.close()

    asyncio.run(scenario())
    assert found["cards"] == found["expected"]
    assert found["counts"]["ready"] == 2


def test_a_shared_build_runs_once_for_streams_asking_at_once() -> None:
    source = FakeSource()
    hub = Hub(source)  # type: ignore[arg-type]
    calls: list[int] = []

    def build() -> str:
        calls.append(1)
        time.sleep(0.05)  # long enough for every caller to arrive while it runs
        return "message"

    async def scenario() -> list[Any]:
        return await asyncio.gather(*(hub.shared("key", build) for _ in range(20)))

    assert asyncio.run(scenario()) == ["message"] * 20
    assert calls == [1]
