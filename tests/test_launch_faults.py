"""One fault, one meaning: whoever launched the worker (cron or kanban), the same fault gives the
same outcome and the same infrastructure flag.

Both policies run over the real process registry (real keepers and workers, SQLite) on one
state dir. Faults the machine cannot produce on demand (a systemd manager vanishing
mid-launch, the host out of descriptors) are raised by the registry's spawn exactly as the
layers below raise them; the rest are real: a program that does not exist, a cwd that is not a
directory, a keeper killed with SIGKILL.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dispatcher.app.database import open_state
from dispatcher.cron.firing import FireRunner
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.records import Kind, Status
from dispatcher.cron.settings import CronJob
from dispatcher.kanban.board import Board
from dispatcher.kanban.settings import Assignee, KanbanSettings
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.kanban.tick import KanbanDispatcher
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.outcome import Outcome
from registry.abc import Session, SpawnRequest
from registry.errors import SpawnRefused
from registry.process import ProcessRegistry
from registry.store.database import StateDB
from scope.errors import ManagerLost
from scope.fake import FakeScoper
from scope.foundation.clock import FakeClock
from tests.support.wait import wait_for
from tests.test_registry_support import settings as registry_settings

NOW = 1_800_000_000.0


class FaultyRegistry(ProcessRegistry):
    """The real registry whose next spawns raise the given errors first."""

    def __init__(self, *args: object, errors: list[BaseException], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.errors = list(errors)

    def spawn(self, request: SpawnRequest) -> Session:
        if self.errors:
            raise self.errors.pop(0)
        return super().spawn(request)


@dataclass(frozen=True, kw_only=True)
class Fault:
    """How to cause one fault, and what it must come to."""

    outcome: Outcome
    infrastructure: bool
    errors: tuple[BaseException, ...] = ()
    command: tuple[str, ...] = ("sh", "-c", "exit 0")
    cwd: str | None = None
    after_spawn: Callable[[ProcessRegistry, str], None] | None = None
    words: str = ""


def kill_keeper(registry: ProcessRegistry, session_id: str) -> None:
    """SIGKILL the session's keeper and its worker (both confirmed by pid + start time)."""
    session = registry.get(session_id)
    for pid, start in (
        (session.keeper_pid, session.keeper_start),
        (session.worker_pid, session.worker_start),
    ):
        if pid is not None and Claimant(pid=pid, start=start, boot=None).alive():
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: registry.get(session_id).finished, 10, what="the session lost")


LOST_MANAGER = ManagerLost("the systemd user manager went away mid-launch", remedy="restart it")
FAULTS = {
    "lost manager": Fault(
        errors=(LOST_MANAGER, LOST_MANAGER),
        outcome=Outcome.SPAWN_REFUSED,
        infrastructure=True,
        words="after one retry",
    ),
    "refused command": Fault(
        errors=(SpawnRefused("it would kill the gateway", remedy="use 'dispatch kill'"),),
        outcome=Outcome.CONFIG_ERROR,
        infrastructure=False,
        words="would kill the gateway",
    ),
    "EMFILE at spawn": Fault(
        errors=(OSError(errno.EMFILE, "Too many open files"),),
        outcome=Outcome.SPAWN_REFUSED,
        infrastructure=True,
        words="ran out of resources",
    ),
    "EAGAIN at spawn": Fault(
        errors=(OSError(errno.EAGAIN, "Resource temporarily unavailable"),),
        outcome=Outcome.SPAWN_REFUSED,
        infrastructure=True,
        words="ran out of resources",
    ),
    "missing program": Fault(
        command=("/nonexistent/dispatch-test-program",),
        outcome=Outcome.FAILED_START,
        infrastructure=False,
    ),
    "bad cwd": Fault(
        cwd="no-such-directory",
        outcome=Outcome.CONFIG_ERROR,
        infrastructure=False,
        words="not a directory",
    ),
    "keeper vanished": Fault(
        command=("sleep", "30"),
        after_spawn=kill_keeper,
        outcome=Outcome.LOST,
        infrastructure=False,
    ),
}


@dataclass
class World:
    """A state dir with the real registry, the board and the ledger on it."""

    state_dir: Path
    config: Path
    db: StateDB
    registry: FaultyRegistry
    environ: dict[str, str] = field(default_factory=lambda: {"PATH": os.environ["PATH"]})


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    state_dir = tmp_path / "state"
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    with open_state(state_dir) as db:
        registry = FaultyRegistry(
            state_dir=state_dir,
            db=db,
            scoper=FakeScoper(probe_ok=False),
            settings=registry_settings(),
            follow=False,
            errors=[],
        )
        try:
            yield World(state_dir=state_dir, config=config, db=db, registry=registry)
        finally:
            for session in registry.list_sessions():
                registry.kill(session.id, reason="test over")
            registry.close()


def through_kanban(world: World, fault: Fault) -> tuple[Outcome | None, bool, str]:
    assignee = Assignee(command=fault.command, cwd=fault.cwd)
    kanban = KanbanSettings(assignees={"w": assignee})
    store = SqliteBoardStore(world.db)
    dispatcher = KanbanDispatcher(
        store=store,
        registry=world.registry,
        settings=kanban,
        state_dir=world.state_dir,
        config_path=world.config,
        environ=world.environ,
    )
    card, _ = Board(store, kanban, registry=lambda: world.registry).add("t", assignee="w", now=NOW)
    dispatcher.tick(NOW)
    (run,) = store.runs_of(card.id)
    if run.open and fault.after_spawn is not None and run.session_id:
        fault.after_spawn(world.registry, run.session_id)
        dispatcher.reconcile(NOW + 1)
    run = store.get_run(run.run_id)
    return run.outcome, run.infrastructure, run.error or ""


def through_cron(world: World, fault: Fault) -> tuple[Outcome | None, bool, str]:
    job = CronJob(id="j", schedule="* * * * *", command=fault.command, cwd=fault.cwd)
    ledger = Ledger(world.db)
    runner = FireRunner(
        ledger,
        world.registry,
        environ=world.environ,
        state_dir=world.state_dir,
        claimant=Claimant.current(instance=True).token(),
        clock=FakeClock(NOW),
        config_path=world.config,
    )
    with ledger.transaction() as tx:
        row_id = tx.insert(
            fire_key="j@2027-01-15T08:00:00+0",
            job_id="j",
            kind=Kind.SCHEDULE,
            nominal_wall="2027-01-15T08:00:00",
            fold=0,
            zone="UTC",
            nominal=NOW,
            decided_at=NOW,
            due_at=NOW,
            status=Status.CLAIMED,
            claimant=runner.claimant,
        )
    assert row_id is not None
    row = runner.start(ledger.get(row_id), job, NOW)
    if row.outcome is None and fault.after_spawn is not None and row.session_id:
        fault.after_spawn(world.registry, row.session_id)
        runner.reconcile({"j": job})
    row = ledger.get(row_id)
    return row.outcome, row.infrastructure, row.error or ""


@pytest.mark.parametrize("launcher", [through_kanban, through_cron], ids=["kanban", "cron"])
@pytest.mark.parametrize("name", sorted(FAULTS))
def test_a_fault_means_the_same_whoever_launched_the_worker(
    world: World, name: str, launcher: Callable[[World, Fault], tuple[Outcome | None, bool, str]]
) -> None:
    fault = FAULTS[name]
    world.registry.errors = list(fault.errors)
    outcome, infrastructure, error = launcher(world, fault)
    assert (outcome, infrastructure) == (fault.outcome, fault.infrastructure), error
    assert fault.words in error
    assert not world.registry.errors  # every injected error was met (and the retry was taken)
