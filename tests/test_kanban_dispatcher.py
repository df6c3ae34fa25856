"""The dispatcher tick with FakeRegistry + FakeScoper + FakeClock: taxonomy, breaker, back-off,
infrastructure cooldown, budgets, reclaim, fences and operator stops."""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dispatcher.app.database import open_state
from dispatcher.kanban.board import Board
from dispatcher.kanban.model import (
    BlockKind,
    CardEdit,
    CardStatus,
    Limits,
    NewCard,
    Run,
)
from dispatcher.kanban.report import TickReport
from dispatcher.kanban.settings import Assignee, KanbanSettings
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.kanban.tick import DEGRADED_WARNING, WALK_PAGE, KanbanDispatcher
from dispatcher.kanban.worker import BODY_ENV_LIMIT
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.outcome import Outcome
from registry.abc import Owner, SessionState, SpawnRequest
from registry.fake import FakeRegistry
from scope.abc import CallerKind, Placement, Policy
from scope.errors import ManagerLost
from scope.fake import FakeScoper
from scope.foundation.clock import FakeClock

BACKOFF_MAX = 600.0
"""The default retry back-off's cap: after this long a counted failure is ready again."""


@dataclass
class Rig:
    """Everything a dispatcher test drives."""

    store: SqliteBoardStore
    board: Board
    registry: FakeRegistry
    scoper: FakeScoper
    clock: FakeClock
    dispatcher: KanbanDispatcher
    state_dir: Path

    def tick(self, **kw: object) -> TickReport:
        return self.dispatcher.tick(self.clock.time(), **kw)  # type: ignore[arg-type]

    def add(self, title: str = "t", assignee: str = "w", **kw: object) -> str:
        card, _ = self.board.add(title, assignee=assignee, now=self.clock.time(), **kw)  # type: ignore[arg-type]
        return card.id

    def session_of(self, card_id: str) -> str:
        runs = self.store.runs_of(card_id)
        assert runs and runs[-1].session_id
        return runs[-1].session_id

    def outcomes(self, card_id: str) -> list[str | None]:
        return [r.outcome.value if r.outcome else None for r in self.store.runs_of(card_id)]

    def events(self, card_id: str) -> list[str]:
        return [e.kind for e in self.store.events_of(card_id)]


def make_rig(
    tmp_path: Path,
    *,
    settings: KanbanSettings | None = None,
    scoper: FakeScoper | None = None,
    environ: dict[str, str] | None = None,
    config_path: Path | None = None,
) -> Iterator[Rig]:
    settings = settings or KanbanSettings(
        assignees={
            "w": Assignee(command=("worker", "--flag"), timeout=60.0),
            "x": Assignee(command=("x",)),
        }
    )
    clock = FakeClock()
    scoper = scoper or FakeScoper(clock=clock)
    registry = FakeRegistry(scoper=scoper, clock=clock)
    state_dir = tmp_path / "state"
    with open_state(state_dir) as db:
        store = SqliteBoardStore(db)
        dispatcher = KanbanDispatcher(
            store=store,
            registry=registry,
            settings=settings,
            state_dir=state_dir,
            caller=CallerKind.KANBAN,
            environ=environ or {"PATH": "/usr/bin", "INVOCATION_ID": "abc", "KEEP": "1"},
            scoper=scoper,
            config_path=config_path,
        )
        board = Board(store, settings, registry=lambda: registry, state_dir=state_dir)
        yield Rig(store, board, registry, scoper, clock, dispatcher, state_dir)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from make_rig(tmp_path)


def finish_last(rig: Rig, card_id: str, **kw: object) -> None:
    rig.registry.finish(rig.session_of(card_id), **kw)  # type: ignore[arg-type]


# -- spawning ---------------------------------------------------------------------------------


def test_a_ready_card_is_spawned_with_its_environment(rig: Rig) -> None:
    card_id = rig.add("Title here", body="line1\nline2")
    report = rig.tick()
    assert [d.card_id for d in report.dispatched] == [card_id]
    run = rig.store.runs_of(card_id)[0]
    session = rig.registry.get(run.session_id or "")
    request: SpawnRequest = rig.registry.requests[session.id]
    assert request.argv == ("worker", "--flag")
    assert request.owner == Owner(kind="kanban", id=run.run_id)
    assert request.caller is CallerKind.KANBAN and request.timeout == 60.0
    env = request.env
    assert env["DISPATCH_CARD_ID"] == card_id and env["DISPATCH_RUN_ID"] == run.run_id
    assert env["DISPATCH_CARD_TITLE"] == "Title here"
    assert env["DISPATCH_CARD_BODY"] == "line1\nline2"
    assert env["DISPATCH_STATE_DIR"] == str(rig.state_dir.absolute())
    assert "INVOCATION_ID" not in env and env["KEEP"] == "1"
    body = Path(env["DISPATCH_CARD_BODY_FILE"])
    assert body.read_text() == "line1\nline2"
    assert stat.S_IMODE(body.stat().st_mode) == 0o600
    assert stat.S_IMODE(body.parent.stat().st_mode) == 0o700
    assert run.placement == Placement.SCOPED.value and run.unit
    card = rig.store.get_card(card_id)
    assert card.status is CardStatus.RUNNING and card.current_run_id == run.run_id
    assert rig.events(card_id) == ["created", "claimed", "spawned"]


def test_a_large_body_goes_only_to_the_file(rig: Rig) -> None:
    card_id = rig.add(body="x" * (BODY_ENV_LIMIT + 1))
    rig.tick()
    env = rig.registry.requests[rig.session_of(card_id)].env
    assert "DISPATCH_CARD_BODY" not in env
    assert Path(env["DISPATCH_CARD_BODY_FILE"]).stat().st_size == BODY_ENV_LIMIT + 1


def test_exit_zero_completes_the_card_and_removes_the_body_file(rig: Rig) -> None:
    card_id = rig.add()
    rig.tick()
    body = Path(rig.registry.requests[rig.session_of(card_id)].env["DISPATCH_CARD_BODY_FILE"])
    finish_last(rig, card_id, exit_code=0)
    report = rig.tick()
    assert [(c.card_id, c.outcome) for c in report.reconciled] == [(card_id, Outcome.COMPLETED)]
    card = rig.store.get_card(card_id)
    assert card.status is CardStatus.DONE and card.completed_at == rig.clock.time()
    assert rig.outcomes(card_id) == ["completed"]
    assert rig.store.runs_of(card_id)[0].exit_code == 0
    assert not body.exists()
    assert rig.tick().dispatched == ()


def test_priority_then_age_decides_the_order(tmp_path: Path) -> None:
    settings = KanbanSettings(max_in_progress=2, assignees={"w": Assignee(command=("w",))})
    for rig in make_rig(tmp_path, settings=settings):
        old = rig.add("old")
        rig.clock.advance(1)
        rig.add("new")
        rig.clock.advance(1)
        urgent = rig.add("urgent", priority=5)
        assert [d.card_id for d in rig.tick().dispatched] == [urgent, old]


# -- taxonomy and breaker ---------------------------------------------------------------------


def test_exit_one_twice_blocks_with_gave_up(rig: Rig) -> None:
    card_id = rig.add()
    rig.tick()
    finish_last(rig, card_id, exit_code=1)
    rig.tick()  # closes the first run: back-off before the second
    rig.clock.advance(BACKOFF_MAX)
    rig.tick()
    finish_last(rig, card_id, exit_code=1)
    rig.tick()
    card = rig.store.get_card(card_id)
    assert card.status is CardStatus.BLOCKED and card.block_kind is None
    assert card.consecutive_failures == 2
    assert card.last_failure_error == "exited with code 1"
    assert rig.events(card_id)[-2:] == ["blocked", "gave_up"]
    assert rig.outcomes(card_id) == ["failed", "failed"]
    assert rig.tick().dispatched == ()
    rig.board.unblock(card_id, now=rig.clock.time())
    assert rig.store.get_card(card_id).consecutive_failures == 0
    assert [d.card_id for d in rig.tick().dispatched] == [card_id]


def test_exit_75_never_counts_and_backs_off(rig: Rig) -> None:
    card_id = rig.add()
    rig.tick()
    finish_last(rig, card_id, exit_code=75)
    rig.tick()
    card = rig.store.get_card(card_id)
    assert card.status is CardStatus.READY and card.consecutive_failures == 0
    assert card.tempfail_count == 1 and card.retry_at == rig.clock.time() + 30
    rig.clock.advance(29)
    report = rig.tick()
    assert report.dispatched == () and report.backing_off == (card_id,)
    rig.clock.advance(1)
    assert [d.card_id for d in rig.tick().dispatched] == [card_id]
    finish_last(rig, card_id, exit_code=75)
    rig.tick()
    assert rig.store.get_card(card_id).retry_at == rig.clock.time() + 60
    assert rig.outcomes(card_id) == ["tempfail", "tempfail"]


def test_tempfail_limit_blocks_transiently_then_returns(tmp_path: Path) -> None:
    settings = KanbanSettings(tempfail_limit=2, assignees={"w": Assignee(command=("w",))})
    for rig in make_rig(tmp_path, settings=settings):
        card_id = rig.add()
        rig.tick()
        finish_last(rig, card_id, exit_code=75)
        rig.tick()
        rig.clock.advance(30)
        assert [d.card_id for d in rig.tick().dispatched] == [card_id]
        finish_last(rig, card_id, exit_code=75)
        rig.tick()
        card = rig.store.get_card(card_id)
        assert card.status is CardStatus.BLOCKED and card.block_kind is BlockKind.TRANSIENT
        assert card.consecutive_failures == 0
        rig.clock.advance(299)
        assert rig.tick().dispatched == ()
        rig.clock.advance(1)
        assert [d.card_id for d in rig.tick().dispatched] == [card_id]
        assert rig.store.get_card(card_id).tempfail_count == 0


def test_exit_78_trips_at_once(rig: Rig) -> None:
    card_id = rig.add(failure_limit=5)
    rig.tick()
    finish_last(rig, card_id, exit_code=78)
    rig.tick()
    card = rig.store.get_card(card_id)
    assert card.status is CardStatus.BLOCKED and "gave_up" in rig.events(card_id)
    assert rig.outcomes(card_id) == ["config_error"]


@pytest.mark.parametrize(
    ("finish", "outcome"),
    [
        ({"exit_code": None, "signal": "SIGKILL"}, "failed"),
        ({"exit_code": None, "signal": "SIGTERM", "state": SessionState.TIMED_OUT}, "timed_out"),
        ({"exit_code": None, "state": SessionState.LOST}, "lost"),
    ],
)
def test_signals_timeouts_and_lost_keepers_count(
    rig: Rig, finish: dict[str, object], outcome: str
) -> None:
    card_id = rig.add()
    rig.tick()
    finish_last(rig, card_id, **finish)
    rig.tick()
    card = rig.store.get_card(card_id)
    assert card.consecutive_failures == 1
    assert rig.outcomes(card_id)[0] == outcome
    # Below the limit: back to ready behind the default back-off (full jitter in [0, 10 s]).
    assert card.status is CardStatus.READY and card.retry_at is not None
    assert rig.clock.time() <= card.retry_at <= rig.clock.time() + 10
    rig.clock.advance(10)
    rig.tick()
    assert rig.store.get_card(card_id).status is CardStatus.RUNNING


def test_a_missing_binary_counts_as_an_ordinary_failure(rig: Rig) -> None:
    rig.registry.failed_start_argv0.add("worker")
    card_id = rig.add()
    report = rig.tick()
    assert [c.outcome for c in report.refused] == [Outcome.FAILED_START]
    assert rig.store.get_card(card_id).consecutive_failures == 1
    rig.clock.advance(BACKOFF_MAX)
    rig.tick()
    card = rig.store.get_card(card_id)
    assert card.status is CardStatus.BLOCKED and card.consecutive_failures == 2


def test_an_explicit_complete_wins_over_a_later_failure(rig: Rig) -> None:
    card_id = rig.add()
    rig.tick()
    run_id = rig.store.get_card(card_id).current_run_id
    rig.board.complete(card_id, run_id, now=rig.clock.time(), result="42")
    assert rig.tick().dispatched == ()  # the open run still holds the card
    finish_last(rig, card_id, exit_code=3)
    rig.tick()
    card = rig.store.get_card(card_id)
    assert card.status is CardStatus.DONE and card.result == "42"
    assert card.consecutive_failures == 0 and card.current_run_id is None
    assert rig.events(card_id)[-1] == "exit_ignored"
    assert rig.outcomes(card_id) == ["failed"]


def test_a_worker_can_block_or_hand_to_review(rig: Rig) -> None:
    first, second = rig.add("a"), rig.add("b")
    rig.tick()
    now = rig.clock.time()
    rig.board.block(
        first, rig.store.get_card(first).current_run_id, kind="transient", reason="rate", now=now
    )
    rig.board.review(second, rig.store.get_card(second).current_run_id, now=now)
    finish_last(rig, first, exit_code=0)
    finish_last(rig, second, exit_code=0)
    rig.tick()
    assert rig.store.get_card(first).status is CardStatus.BLOCKED
    assert rig.store.get_card(first).blocked_until == now + 300
    assert rig.store.get_card(second).status is CardStatus.REVIEW


# -- infrastructure ---------------------------------------------------------------------------


def teardown_rig(tmp_path: Path, **kw: object) -> Iterator[Rig]:
    scoper = FakeScoper(in_teardown_unit=True, probe_ok=False, caller_unit="tick.service")
    return make_rig(tmp_path, scoper=scoper, **kw)  # type: ignore[arg-type]


def test_refused_spawns_are_infrastructure_and_never_count(tmp_path: Path) -> None:
    for rig in teardown_rig(tmp_path):
        card_id = rig.add()
        for _ in range(3):
            report = rig.tick()
            assert [c.infrastructure for c in report.refused] == [True]
            rig.clock.advance(301)
        card = rig.store.get_card(card_id)
        assert card.status is CardStatus.READY and card.consecutive_failures == 0
        assert "loginctl enable-linger" in (card.last_failure_error or "")
        runs = rig.store.runs_of(card_id)
        assert [(r.outcome, r.infrastructure) for r in runs] == [(Outcome.SPAWN_REFUSED, True)] * 3
        rig.scoper.probe_ok = True
        report = rig.tick()
        assert [d.card_id for d in report.dispatched] == [card_id]


def test_the_cooldown_guards_each_tick_until_a_probe_succeeds(tmp_path: Path) -> None:
    for rig in teardown_rig(tmp_path):
        card_id = rig.add()
        rig.tick()
        rig.clock.advance(10)
        report = rig.tick()
        assert report.guarded == (card_id,) and report.dispatched == ()
        rig.tick()
        assert rig.events(card_id).count("respawn_guarded") == 2
        assert len(rig.store.runs_of(card_id)) == 1
        rig.scoper.probe_ok = True  # the manager is back: no need to wait out the cooldown
        report = rig.tick()
        assert [d.card_id for d in report.dispatched] == [card_id]
        assert "cooldown_ended" in rig.events(card_id)


def test_a_zero_cooldown_retries_every_tick(tmp_path: Path) -> None:
    settings = KanbanSettings(infrastructure_cooldown=0, assignees={"w": Assignee(command=("w",))})
    for rig in teardown_rig(tmp_path, settings=settings):
        card_id = rig.add()
        for _ in range(3):
            rig.tick()
        assert rig.outcomes(card_id) == ["spawn_refused"] * 3


def test_a_lost_manager_is_infrastructure_after_one_retry(rig: Rig) -> None:
    lost = ManagerLost("bus socket vanished", remedy="fix: restart")
    rig.registry.spawn_errors.extend([lost, lost])
    card_id = rig.add()
    report = rig.tick()
    assert [(c.outcome, c.infrastructure) for c in report.refused] == [
        (Outcome.SPAWN_REFUSED, True)
    ]
    assert "after one retry" in (report.refused[0].error or "")
    assert rig.store.get_card(card_id).consecutive_failures == 0


def test_a_manager_lost_once_is_retried_at_once(rig: Rig) -> None:
    rig.registry.spawn_errors.append(ManagerLost("bus socket vanished", remedy="fix: restart"))
    card_id = rig.add()
    report = rig.tick()
    assert [d.card_id for d in report.dispatched] == [card_id] and not report.refused


def test_degrading_is_allowed_by_config_and_warns(tmp_path: Path) -> None:
    scoper = FakeScoper(
        in_teardown_unit=True, probe_ok=False, policy=Policy(kanban_degrade_without_scope=True)
    )
    settings = KanbanSettings(degrade_without_scope=True, assignees={"w": Assignee(command=("w",))})
    for rig in make_rig(tmp_path, settings=settings, scoper=scoper):
        rig.add()
        report = rig.tick()
        assert [d.placement for d in report.dispatched] == ["degraded"]
        assert report.warnings == (DEGRADED_WARNING,)
        assert "KillMode=process" in DEGRADED_WARNING and "linger" in DEGRADED_WARNING


# -- budgets, pause, assignees ----------------------------------------------------------------


def test_global_and_assignee_budgets(tmp_path: Path) -> None:
    settings = KanbanSettings(
        max_in_progress=3,
        assignees={"w": Assignee(command=("w",), max_in_progress=1), "x": Assignee(command=("x",))},
    )
    for rig in make_rig(tmp_path, settings=settings):
        ws, xs = [], []
        for i in range(4):
            if i < 3:
                ws.append(rig.add(f"w{i}", "w"))
            rig.clock.advance(1)
            xs.append(rig.add(f"x{i}", "x"))
            rig.clock.advance(1)
        report = rig.tick()
        assert [d.card_id for d in report.dispatched] == [ws[0], xs[0], xs[1]]
        assert set(report.deferred) == {*ws[1:], *xs[2:]}
        assert rig.tick().dispatched == ()
        finish_last(rig, ws[0], exit_code=0)
        assert [d.card_id for d in rig.tick().dispatched] == [ws[1]]


def test_a_full_board_is_not_read_to_its_end(tmp_path: Path) -> None:
    settings = KanbanSettings(max_in_progress=2, assignees={"w": Assignee(command=("w",))})
    for rig in make_rig(tmp_path, settings=settings):
        cards = []
        for i in range(WALK_PAGE + 50):
            cards.append(rig.add(f"c{i}", "w"))
            rig.clock.advance(1)  # claimed oldest first
        report = rig.tick()
        assert [d.card_id for d in report.dispatched] == cards[:2]
        # The walk stops after the page where the budget filled up.
        assert list(report.deferred) == cards[2:WALK_PAGE]
        planned = rig.tick(dry_run=True)
        assert planned.planned == () and len(planned.deferred) == WALK_PAGE


def test_max_claims_and_dry_run(rig: Rig) -> None:
    ids = []
    for i in range(3):
        ids.append(rig.add(f"c{i}"))
        rig.clock.advance(1)
    version = rig.store.board_version()
    dry = rig.tick(dry_run=True)
    assert dry.planned == tuple(ids) and dry.dispatched == ()
    assert rig.store.board_version() == version and rig.store.open_runs() == []
    assert [d.card_id for d in rig.tick(max_claims=1).dispatched] == ids[:1]


def test_pause_stops_claiming_but_not_reconciling(rig: Rig) -> None:
    first = rig.add()
    rig.tick()
    second = rig.add()
    rig.store.set_paused(True)
    finish_last(rig, first, exit_code=0)
    report = rig.tick()
    assert report.paused and report.dispatched == ()
    assert rig.store.get_card(first).status is CardStatus.DONE
    rig.store.set_paused(False)
    assert [d.card_id for d in rig.tick().dispatched] == [second]


def test_an_unknown_assignee_is_never_spawned_and_noted_once(rig: Rig) -> None:
    # Stored directly: the CLI refuses unknown assignees, but the config may lose one later.
    card, _ = rig.store.add_card(NewCard(title="t", assignee="ghost"), now=rig.clock.time())
    for _ in range(3):
        report = rig.tick()
        assert report.unknown_assignee == (card.id,) and report.dispatched == ()
    assert rig.events(card.id).count("assignee_unknown") == 1
    rig.board.edit(card.id, CardEdit(assignee="w"), now=rig.clock.time())
    assert [d.card_id for d in rig.tick().dispatched] == [card.id]


def test_parents_gate_children(rig: Rig) -> None:
    parent = rig.add("parent")
    child = rig.add("child", parents=[parent])
    assert [d.card_id for d in rig.tick().dispatched] == [parent]
    finish_last(rig, parent, exit_code=0)
    report = rig.tick()
    assert report.promoted == (child,)
    assert [d.card_id for d in report.dispatched] == [child]


# -- reclaim and restarts ---------------------------------------------------------------------


def dead_claimer() -> tuple[int, int]:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=10)
    return child.pid, 1


def test_a_run_whose_claimer_died_before_spawning_is_reclaimed(rig: Rig) -> None:
    card_id, _ = claimed_by_the_dead(rig)
    report = rig.tick()
    assert [c.outcome for c in report.reconciled] == [Outcome.RECLAIMED]
    assert [d.card_id for d in report.dispatched] == [card_id]
    card = rig.store.get_card(card_id)
    assert card.consecutive_failures == 0
    assert rig.outcomes(card_id) == ["reclaimed", None]


def test_a_run_whose_claimer_lives_is_left_alone(rig: Rig) -> None:
    card_id = rig.add()
    rig.store.claim(
        card_id, now=rig.clock.time(), claimer=Claimant.current(), limits=Limits(max_in_progress=9)
    )
    report = rig.tick()
    assert report.reconciled == () and report.dispatched == ()
    assert rig.outcomes(card_id) == [None]


def claimed_by_the_dead(rig: Rig) -> tuple[str, Run]:
    """A card claimed by a dispatcher that has since died (its run open, nothing recorded)."""
    card_id = rig.add()
    pid, start = dead_claimer()
    claim = rig.store.claim(
        card_id,
        now=rig.clock.time(),
        claimer=Claimant(pid=pid, start=start, boot=None),
        limits=Limits(max_in_progress=9),
    )
    assert claim.run is not None
    return card_id, claim.run


def test_an_unrecorded_spawn_is_found_by_owner_not_respawned(rig: Rig) -> None:
    card_id, run = claimed_by_the_dead(rig)
    # The dead dispatcher got as far as spawning: its worker lives on.
    session = rig.registry.spawn(
        SpawnRequest(argv=["w"], cwd="/", env={}, owner=Owner(kind="kanban", id=run.run_id))
    )
    report = rig.tick()
    assert report.reconciled == () and report.dispatched == ()
    assert rig.store.get_run(run.run_id).session_id == session.id
    assert len(rig.registry.running()) == 1
    rig.registry.finish(session.id, exit_code=0)
    rig.tick()
    assert rig.store.get_card(card_id).status is CardStatus.DONE


def test_the_timeout_backstop_kills_through_the_registry(rig: Rig) -> None:
    card_id = rig.add()
    rig.tick()
    rig.clock.advance(60 + 29)
    rig.tick()
    assert rig.registry.get(rig.session_of(card_id)).state is SessionState.RUNNING
    first = rig.session_of(card_id)
    rig.clock.advance(2)
    rig.tick()
    assert rig.registry.get(first).state is SessionState.TIMED_OUT
    assert rig.store.get_card(card_id).consecutive_failures == 1
    rig.clock.advance(BACKOFF_MAX)
    rig.tick()
    assert rig.outcomes(card_id) == ["timed_out", None]  # counted, below the limit: retried


# -- operator stops ---------------------------------------------------------------------------


def test_archive_kills_the_running_worker_first(rig: Rig) -> None:
    card_id = rig.add()
    rig.tick()
    session_id = rig.session_of(card_id)
    card = rig.board.archive(card_id, now=rig.clock.time())
    assert card.status is CardStatus.ARCHIVED and card.current_run_id is None
    assert rig.registry.get(session_id).state is SessionState.KILLED
    assert rig.events(card_id)[-2:] == ["stopped", "archived"]
    assert rig.store.get_card(card_id).consecutive_failures == 0


def test_move_of_a_running_card_stops_it(rig: Rig) -> None:
    card_id = rig.add()
    rig.tick()
    session_id = rig.session_of(card_id)
    card = rig.board.move(card_id, "blocked", now=rig.clock.time())
    assert card.status is CardStatus.BLOCKED and card.block_kind is BlockKind.NEEDS_INPUT
    assert rig.registry.get(session_id).finished
    assert rig.tick().dispatched == ()


def test_a_run_closed_during_its_spawn_kills_the_new_worker(tmp_path: Path) -> None:
    for rig in make_rig(tmp_path):
        card_id = rig.add()
        original = rig.registry.spawn
        board = rig.board
        now = rig.clock.time()

        def spawn_then_archive(
            request: SpawnRequest, original=original, board=board, card_id=card_id, now=now
        ) -> object:
            session = original(request)
            board.archive(card_id, now=now)  # the operator was quicker
            return session

        rig.registry.spawn = spawn_then_archive  # type: ignore[method-assign,assignment]
        report = rig.tick()
        assert report.dispatched == ()
        assert rig.registry.running() == []
        assert rig.store.get_card(card_id).status is CardStatus.ARCHIVED


def test_an_unsafe_env_file_is_a_config_error(tmp_path: Path) -> None:
    env_file = tmp_path / "secrets.env"
    env_file.write_text("TOKEN=abc\n")
    os.chmod(env_file, 0o644)
    settings = KanbanSettings(assignees={"w": Assignee(command=("w",), env_file=str(env_file))})
    for rig in make_rig(tmp_path, settings=settings):
        card_id = rig.add()
        report = rig.tick()
        assert [c.outcome for c in report.refused] == [Outcome.CONFIG_ERROR]
        card = rig.store.get_card(card_id)
        assert card.status is CardStatus.BLOCKED and "chmod 600" in (card.last_failure_error or "")
        os.chmod(env_file, 0o600)
        rig.board.unblock(card_id, now=rig.clock.time())
        rig.tick()
        env = rig.registry.requests[rig.session_of(card_id)].env
        assert env["TOKEN"] == "abc"


def test_env_layers_and_relative_paths(tmp_path: Path) -> None:
    config = tmp_path / "conf" / "config.yaml"
    config.parent.mkdir()
    config.write_text("")
    (tmp_path / "conf" / "work").mkdir()
    env_file = tmp_path / "conf" / "w.env"
    env_file.write_text("# comment\nexport A='from file'\nB=file\n\nDISPATCH_CARD_ID=spoof\n")
    os.chmod(env_file, 0o600)
    assignee = Assignee(command=("w",), cwd="work", env={"B": "env"}, env_file="w.env")
    settings = KanbanSettings(assignees={"w": assignee})
    for rig in make_rig(tmp_path, settings=settings, config_path=config):
        card_id = rig.add()
        rig.tick()
        request = rig.registry.requests[rig.session_of(card_id)]
        assert request.cwd == str(tmp_path / "conf" / "work")
        assert request.env["A"] == "from file" and request.env["B"] == "env"
        assert request.env["DISPATCH_CARD_ID"] == card_id
        assert request.env["DISPATCH_CONFIG"] == str(config.absolute())


# -- gateway hooks and concurrency ------------------------------------------------------------


def test_session_finished_closes_the_run_at_once(rig: Rig) -> None:
    card_id = rig.add()
    rig.tick()
    session = rig.registry.finish(rig.session_of(card_id), exit_code=0)
    closed = rig.dispatcher.session_finished(session, rig.clock.time())
    assert closed is not None and closed.outcome is Outcome.COMPLETED
    assert rig.store.get_card(card_id).status is CardStatus.DONE
    assert rig.dispatcher.session_finished(session, rig.clock.time()) is None


def test_the_board_version_moves_when_work_appears(rig: Rig) -> None:
    seen = rig.store.board_version()
    rig.add()
    assert rig.store.board_version() > seen


@pytest.mark.parametrize("concurrency", [1, 3])
def test_spawns_keep_claim_order_at_any_concurrency(tmp_path: Path, concurrency: int) -> None:
    settings = KanbanSettings(
        spawn_concurrency=concurrency, assignees={"w": Assignee(command=("w",))}
    )
    for rig in make_rig(tmp_path, settings=settings):
        ids = []
        for i in range(6):
            ids.append(rig.add(f"c{i}", priority=10 - i))
        report = rig.tick()
        assert [d.card_id for d in report.dispatched] == ids
        assert len(rig.registry.running()) == 6


# -- degraded workers taken down by the gateway's stop -----------------------------------------


def degraded_rig(tmp_path: Path) -> Iterator[Rig]:
    settings = KanbanSettings(
        degrade_without_scope=True, assignees={"w": Assignee(command=("worker",))}
    )
    scoper = FakeScoper(
        in_teardown_unit=True,
        probe_ok=False,
        policy=Policy(kanban_degrade_without_scope=True),
    )
    yield from make_rig(tmp_path, settings=settings, scoper=scoper)


def test_a_degraded_worker_killed_by_the_gateway_stop_is_not_counted(tmp_path: Path) -> None:
    for rig in degraded_rig(tmp_path):
        card_id = rig.add()
        rig.tick()
        session = rig.registry.get(rig.session_of(card_id))
        assert session.placement is Placement.DEGRADED
        assert rig.dispatcher.gateway_stopping([session], rig.clock.time())
        rig.registry.finish(session.id, exit_code=None, signal="SIGTERM")
        rig.dispatcher.reconcile(rig.clock.time())
        card = rig.store.get_card(card_id)
        assert card.status is CardStatus.READY
        assert card.consecutive_failures == 0
        assert "interrupted" in rig.events(card_id)
        (run, *_) = rig.store.runs_of(card_id)
        assert run.infrastructure is True and run.signal == "SIGTERM"


def test_a_degraded_worker_that_fails_on_its_own_still_counts(tmp_path: Path) -> None:
    for rig in degraded_rig(tmp_path):
        card_id = rig.add()
        rig.tick()
        session_id = rig.session_of(card_id)
        rig.registry.finish(session_id, exit_code=None, signal="SIGTERM")
        rig.tick()
        assert rig.store.get_card(card_id).consecutive_failures == 1


def test_a_draft_session_of_a_dead_claimer_is_reclaimed_not_counted(rig: Rig) -> None:
    """The claimer died mid-launch: the registry holds only a draft (no keeper yet). The run
    is reclaimed (not counted) and the card starts again, never recorded with the draft."""
    card_id, run = claimed_by_the_dead(rig)
    draft = rig.registry.spawn(
        SpawnRequest(argv=["w"], cwd="/", env={}, owner=Owner(kind="kanban", id=run.run_id))
    )
    rig.registry.sessions[draft.id] = dataclasses.replace(draft, keeper_pid=None)
    rig.tick()
    first = rig.store.get_run(run.run_id)
    assert first.outcome is Outcome.RECLAIMED and first.session_id is None
    assert rig.store.get_card(card_id).consecutive_failures == 0
    assert rig.outcomes(card_id) == ["reclaimed", None]  # started again


def test_running_out_of_file_descriptors_is_infrastructure(rig: Rig) -> None:
    card_id = rig.add()
    rig.registry.spawn_errors.append(OSError(errno.EMFILE, "Too many open files"))
    report = rig.tick()
    assert [c.outcome for c in report.refused] == [Outcome.SPAWN_REFUSED]
    card = rig.store.get_card(card_id)
    assert card.status is CardStatus.READY and card.consecutive_failures == 0
    (run,) = rig.store.runs_of(card_id)
    assert run.infrastructure and "ran out of resources" in (run.error or "")
