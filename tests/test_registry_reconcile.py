"""Reconciling a scoped session whose keeper is gone: what the unit's liveness check may swallow.

Only the scope layer's own errors mean "the manager cannot confirm the unit" (then the session
is lost); anything else is a bug and must not turn a live session into ``lost``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from registry.abc import Session, SessionState
from registry.lifecycle.reconcile import STARTING_GRACE
from registry.process import ProcessRegistry
from scope.abc import CallerKind, Placement
from scope.errors import BusError, ManagerLost
from scope.fake import FakeScoper
from scope.foundation.clock import FakeClock
from tests.test_registry_support import OWNER, open_registry

UNIT = "dispatch-test-s_0123456789ab.scope"


class BrokenUnitPids(FakeScoper):
    """A scoper whose unit lookup fails with a chosen error."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(probe_ok=False)
        self.error = error
        self.asked: list[str] = []

    def unit_pids(self, unit: str) -> list[int] | None:
        self.asked.append(unit)
        raise self.error


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_000_000.0)


def _scoped_draft(registry: ProcessRegistry, tmp_path: Path, clock: FakeClock) -> str:
    """A scoped row whose keeper never reported (so only its unit can say it lives), made
    old enough that the starting grace is over."""
    session_id = "s_0123456789ab"
    directory = tmp_path / "sdir"
    directory.mkdir()
    draft = Session(
        id=session_id,
        argv=("sleep", "60"),
        cwd="/",
        owner=OWNER,
        caller=CallerKind.CLI,
        placement=Placement.SCOPED,
        unit=UNIT,
        state=SessionState.RUNNING,
        log_path=str(directory / "output.log"),
    )
    registry.store.insert(draft, dir=str(directory), created_at=clock.time(), output_chars=None)
    clock.advance(STARTING_GRACE + 1)
    return session_id


Build = Callable[[BaseException], tuple[ProcessRegistry, BrokenUnitPids, str]]


@pytest.fixture
def make(tmp_path: Path, clock: FakeClock) -> Iterator[Build]:
    """Open a registry over a scoper failing with the given error, with one scoped row."""
    with contextlib.ExitStack() as stack:

        def build(error: BaseException) -> tuple[ProcessRegistry, BrokenUnitPids, str]:
            scoper = BrokenUnitPids(error)
            registry = stack.enter_context(
                open_registry(tmp_path / "state", scoper, follow=False, clock=clock, cleanup=False)
            )
            return registry, scoper, _scoped_draft(registry, tmp_path, clock)

        yield build


@pytest.mark.parametrize(
    "error",
    [ManagerLost("the bus socket is gone"), BusError("no runtime dir")],
    ids=["manager-lost", "bus-error"],
)
def test_a_scope_error_means_nothing_confirms_the_unit(make: Build, error: Exception) -> None:
    registry, scoper, session_id = make(error)
    session = registry.get(session_id)
    assert scoper.asked == [UNIT]
    assert session.state is SessionState.LOST
    assert "the keeper never started" in (session.completion_reason or "")


def test_any_other_error_propagates_and_the_session_stays_running(make: Build) -> None:
    registry, scoper, session_id = make(RuntimeError("a bug in the scoper"))
    with pytest.raises(RuntimeError, match="a bug in the scoper"):
        registry.get(session_id)
    assert scoper.asked == [UNIT]
    stored = registry.store.get(session_id)
    assert stored is not None and stored.session.state is SessionState.RUNNING
