"""The gateway's loop as one deterministic step: ``Gateway.step(now)`` driven with a fake clock.

The parts are real (SQLite, the process registry, keepers, real workers, cron's APScheduler
waker); only time is injected, so a safety tick, a board poll, a watchdog ping or a status
refresh is due exactly when the clock says so, and no test sleeps to reach it. The serve process
itself (signals, the wake socket, the notify protocol end to end) is in test_gateway_serve.py.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.app.workspace import Workspace
from dispatcher.config import load_config
from dispatcher.gateway.serve import BOARD_POLL, STATUS_INTERVAL, Gateway
from dispatcher.gateway.statusfile import read_status
from dispatcher.kanban.model import CardStatus
from scope.foundation.clock import FakeClock
from tests.support.env import no_bus_env
from tests.support.wait import wait_for

T0 = 1_800_000_000.0
SAFETY = 30.0

CONFIG = """
serve:
  safety_tick: 30s
kanban:
  assignees:
    quick:
      command: [sh, -c, 'exit 0']
"""


class Rig:
    """A started gateway on a fake clock, and a way to change the board from "elsewhere"."""

    def __init__(self, home: Path, environ: dict[str, str] | None = None) -> None:
        self.home = home
        self.state = home / "state"
        self.config = home / "config.yaml"
        self.config.write_text(CONFIG)
        self.environ = environ or no_bus_env(home)
        self.clock = FakeClock(T0)
        self.settings = load_config(self.config).settings
        self.gateway = Gateway(
            settings=self.settings,
            state_dir=self.state,
            environ=self.environ,
            config_path=self.config,
            clock=self.clock,
        )
        self.gateway.start()
        self.started = self.clock.monotonic()

    def add_card(self, title: str = "t") -> str:
        """Add a card the way ``dispatch kanban add`` does (its poke finds no socket here)."""
        workspace = Workspace(self.settings, self.state, environ=self.environ, clock=self.clock)
        try:
            card, _ = workspace.board.add(title, assignee="quick", now=self.clock.time())
        finally:
            workspace.close()
        return card.id

    def status(self, card_id: str) -> CardStatus:
        assert self.gateway._store is not None
        return self.gateway._store.get_card(card_id).status

    def step_at(self, offset: float, *, poked: bool = False) -> float:
        """Move the clock to ``started + offset`` and step there; returns the next deadline
        relative to the start."""
        self.clock.advance(self.started + offset - self.clock.monotonic())
        return self.gateway.step(self.clock.monotonic(), poked=poked) - self.started

    def close(self) -> None:
        self.gateway.shutdown()
        self.gateway.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path)
    try:
        yield made
    finally:
        made.close()


def test_step_answers_when_it_next_needs_to_run(leak_guard, rig: Rig) -> None:
    assert rig.gateway.next_deadline() - rig.started == BOARD_POLL
    ticks = rig.gateway.kanban_ticks
    # Nothing changed and nothing is due: no tick, and the board poll is still next.
    assert rig.step_at(0.1) == pytest.approx(BOARD_POLL)
    assert rig.gateway.kanban_ticks == ticks
    # Each board poll is due BOARD_POLL after the last one.
    assert rig.step_at(BOARD_POLL) == pytest.approx(2 * BOARD_POLL)
    assert rig.gateway.kanban_ticks == ticks


def test_a_card_added_without_a_poke_runs_at_the_next_board_poll(leak_guard, rig: Rig) -> None:
    card_id = rig.add_card()
    ticks = rig.gateway.kanban_ticks
    rig.step_at(0.1)
    assert rig.status(card_id) is CardStatus.READY
    assert rig.gateway.kanban_ticks == ticks
    rig.step_at(BOARD_POLL)
    assert rig.gateway.kanban_ticks == ticks + 1
    # Claimed by that tick (the quick worker may already be over when its spawn returns).
    assert rig.status(card_id) in (CardStatus.RUNNING, CardStatus.DONE)

    # The worker's end reaches the gateway through the registry's follower; the next step
    # closes the run without any time passing on the clock.
    def done() -> bool:
        rig.gateway.step(rig.clock.monotonic())
        return rig.status(card_id) is CardStatus.DONE

    wait_for(done, timeout=10, what="the run closed by a step")


def test_a_poke_ticks_at_once(rig: Rig) -> None:
    card_id = rig.add_card()
    ticks = rig.gateway.kanban_ticks
    rig.step_at(0.01, poked=True)
    assert rig.gateway.kanban_ticks == ticks + 1
    # Claimed by that tick: running, or already closed when the quick worker ended before
    # its spawn returned (the spawn then closes the run at once).
    assert rig.status(card_id) in (CardStatus.RUNNING, CardStatus.DONE)


def test_the_safety_tick_and_status_refresh_come_due_on_the_clock(rig: Rig) -> None:
    ticks = rig.gateway.kanban_ticks
    before = read_status(rig.state)
    assert before is not None
    rig.step_at(STATUS_INTERVAL - 0.01)
    assert read_status(rig.state) == before
    rig.step_at(STATUS_INTERVAL)
    refreshed = read_status(rig.state)
    assert refreshed is not None and refreshed.updated_at == rig.clock.time()
    rig.step_at(SAFETY - 0.01)
    assert rig.gateway.kanban_ticks == ticks
    next_deadline = rig.step_at(SAFETY)
    assert rig.gateway.kanban_ticks == ticks + 1
    # The board poll at SAFETY - 0.01 is next; the safety tick moved a whole period on.
    assert next_deadline == pytest.approx(SAFETY - 0.01 + BOARD_POLL)
    # The next safety tick is a whole period later.
    rig.step_at(2 * SAFETY - 0.01)
    assert rig.gateway.kanban_ticks == ticks + 1
    rig.step_at(2 * SAFETY)
    assert rig.gateway.kanban_ticks == ticks + 2


def test_the_watchdog_is_pinged_when_its_deadline_comes(leak_guard, tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.setblocking(False)
    # WatchdogSec=2s: the gateway pings every second (half the manager's timeout).
    env = {
        **no_bus_env(tmp_path),
        "NOTIFY_SOCKET": str(tmp_path / "notify"),
        "WATCHDOG_USEC": "2000000",
    }
    rig = Rig(tmp_path, environ=env)
    try:

        def messages() -> list[str]:
            found = []
            while True:
                try:
                    found.append(sock.recv(4096).decode())
                except BlockingIOError:
                    return found

        assert any(m.startswith("READY=1") for m in messages())
        assert rig.gateway.next_deadline() - rig.started == BOARD_POLL
        rig.step_at(0.99)
        assert "WATCHDOG=1" not in messages()
        assert rig.step_at(1.0) == pytest.approx(0.99 + BOARD_POLL)  # the next board poll
        assert messages() == ["WATCHDOG=1"]
        rig.step_at(1.99)
        assert messages() == []
        rig.step_at(2.0)
        assert messages() == ["WATCHDOG=1"]
    finally:
        rig.close()
        sock.close()


def test_a_reload_request_is_applied_by_the_next_step(rig: Rig) -> None:
    rig.config.write_text(CONFIG + "    other:\n      command: [sh, -c, 'exit 0']\n")
    rig.gateway.request_reload()
    assert "other" not in rig.gateway.settings.kanban.assignees
    ticks = rig.gateway.kanban_ticks
    rig.step_at(0.01)
    assert "other" in rig.gateway.settings.kanban.assignees
    assert rig.gateway.kanban_ticks == ticks + 1  # a reload looks at the board at once
