"""The scoper contract (scope/abc.py ``Scoper``), run against every implementation.

* ``fake``: :class:`scope.fake.FakeScoper` (the real placement table, real processes, process
  groups standing in for units);
* ``systemd``: the real scoper (:func:`scope.open_scoper`) on a private systemd user manager
  (the ``systemd`` tier: skipped without one, a failure in CI).

Each test states a promise of the contract: the placement table's rows as a caller meets
them, a scoped launch running inside its unit, ``stop`` emptying the unit with escalation, a
lost manager flipping the verdict at once. Backend details live in test_scope_systemd.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scope import open_scoper, policy_from
from scope.abc import CallerKind, LaunchSpec, Placement, Scoper
from scope.errors import ManagerLost, ScopeUnavailable
from scope.fake import FakeScoper
from scope.foundation.clock import FakeClock
from scope.settings import ScopeSettings
from scope.unitname import is_ours
from tests.support.systemd import SystemdManager

PY = sys.executable

# Honours the gate when given one (as the keeper does), then says so and keeps running.
READY = """\
import os, signal, sys, time
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
fd = os.environ.get("DISPATCH_SCOPE_GATE_FD")
if fd is not None and os.read(int(fd), 1) != b"1":
    sys.exit(3)
print("ready", flush=True)
time.sleep(60)
"""

Make = Callable[..., Scoper]
"""``make(in_unit=False, cron_strict=False, kanban_degrade=False)``: a scoper to test."""


@dataclass(frozen=True)
class Subject:
    """How a test builds scopers and takes their manager away."""

    make: Make
    unreachable: Callable[[], contextlib.AbstractContextManager[None]]
    """Inside the block no manager can be reached (probes fail; scoped launches fail)."""
    env: dict[str, str]
    """The environment a launched program gets (the manager's bus, for the real one)."""


def _fake_subject() -> Iterator[Subject]:
    made: list[FakeScoper] = []

    def make(
        *, in_unit: bool = False, cron_strict: bool = False, kanban_degrade: bool = False
    ) -> FakeScoper:
        scoper = FakeScoper(
            in_teardown_unit=in_unit,
            caller_unit="gateway.service" if in_unit else None,
            policy=policy_from(cron_strict, kanban_degrade),
        )
        made.append(scoper)
        return scoper

    @contextlib.contextmanager
    def unreachable() -> Iterator[None]:
        # As with a real manager: a scoper that already holds an "up" verdict learns of the
        # loss from its next scoped launch; one that probes now finds nothing.
        for scoper in made:
            if scoper.probe_count:
                scoper.lose_manager_on_next_launch()
            else:
                scoper.probe_ok = False
        try:
            yield
        finally:
            for scoper in made:
                scoper.lose_manager_on_next_launch(False)
                scoper.probe_ok = True

    yield Subject(make, unreachable, dict(os.environ))


def _systemd_subject(manager: SystemdManager) -> Iterator[Subject]:
    made: list[Scoper] = []

    def make(
        *, in_unit: bool = False, cron_strict: bool = False, kanban_degrade: bool = False
    ) -> Scoper:
        env = dict(manager.env)
        env.pop("INVOCATION_ID", None)
        if in_unit:
            env["INVOCATION_ID"] = "0123456789abcdef"
        scoper = open_scoper(
            ScopeSettings(),
            policy_from(cron_strict, kanban_degrade),
            environ=env,
            clock=FakeClock(),  # verdicts expire only when a test says so
        )
        made.append(scoper)
        return scoper

    try:
        yield Subject(make, manager.manager_unreachable, dict(manager.env))
    finally:
        for scoper in made:
            scoper.close()


@pytest.fixture(params=["fake", pytest.param("systemd", marks=pytest.mark.systemd)])
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    if request.param == "fake":
        yield from _fake_subject()
    else:
        yield from _systemd_subject(request.getfixturevalue("systemd_manager"))


def _spec(subject: Subject, tmp_path: Path, *, ignore_term: bool = False) -> LaunchSpec:
    env = {**subject.env, "PATH": os.environ.get("PATH", os.defpath)}
    if ignore_term:
        env["IGNORE_TERM"] = "1"
    return LaunchSpec(
        argv=[PY, "-I", "-c", READY],
        env=env,
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        unit_parts=("c1", "run", "r7"),
        gated=True,
    )


def _ready(process: subprocess.Popen[bytes]) -> None:
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"


def _reap(process: subprocess.Popen[bytes]) -> None:
    process.wait(timeout=10)
    if process.stdout is not None:
        process.stdout.close()


def _true(subject: Subject, tmp_path: Path) -> LaunchSpec:
    return LaunchSpec(argv=["true"], env=subject.env, cwd=str(tmp_path))


# -- placement ---------------------------------------------------------------------------------


def test_a_cli_caller_outside_a_unit_gets_its_own_scope(subject: Subject) -> None:
    scoper = subject.make()
    verdict = scoper.probe()
    assert verdict.ok and verdict.backend
    assert scoper.decide(CallerKind.CLI).placement is Placement.SCOPED
    assert scoper.decide(CallerKind.CLI, wants_isolation=False).placement is Placement.IN_PROCESS


# ``leak_guard`` comes before ``subject``: its check then runs after the scopers are closed.
def test_scoped_launch_runs_inside_its_unit_and_stop_empties_it(
    leak_guard: object, subject: Subject, tmp_path: Path
) -> None:
    scoper = subject.make()
    launched = scoper.launch(_spec(subject, tmp_path), CallerKind.CLI)
    assert launched.placement is Placement.SCOPED and launched.warning is None
    unit = launched.unit
    assert unit is not None and is_ours(unit) and unit.startswith("dispatch-cli-c1-run-r7")
    _ready(launched.process)
    assert launched.pid in (scoper.unit_pids(unit) or [])
    result = scoper.stop(unit, grace=5.0)
    assert result.stopped and result.signal == "SIGTERM" and not result.survivors
    _reap(launched.process)
    assert not scoper.unit_pids(unit)
    assert scoper.stop(unit, grace=0.1).stopped  # stopping a stopped unit is success


def test_stop_escalates_when_sigterm_is_ignored(
    leak_guard: object, subject: Subject, tmp_path: Path
) -> None:
    scoper = subject.make()
    launched = scoper.launch(_spec(subject, tmp_path, ignore_term=True), CallerKind.KANBAN)
    assert launched.unit is not None
    _ready(launched.process)
    result = scoper.stop(launched.unit, grace=0.3)
    assert result.stopped and result.signal == "SIGKILL" and not result.survivors
    _reap(launched.process)
    assert launched.process.returncode == -9


def test_an_unknown_unit_is_not_loaded(subject: Subject) -> None:
    scoper = subject.make()
    assert scoper.unit_pids("dispatch-cli-never-existed.scope") is None
    assert scoper.stop("dispatch-cli-never-existed.scope", grace=0.1).stopped


def test_policy_when_no_scope_can_be_made(subject: Subject, tmp_path: Path) -> None:
    inside = subject.make(in_unit=True)
    strict = subject.make(in_unit=True, cron_strict=True)
    lenient = subject.make(in_unit=True, kanban_degrade=True)
    outside = subject.make()
    spec = _true(subject, tmp_path)
    with subject.unreachable():
        assert not inside.probe().ok and not outside.probe().ok
        with pytest.raises(ScopeUnavailable) as refused:
            inside.launch(spec, CallerKind.KANBAN)
        assert "kanban.degrade_without_scope" in refused.value.message
        with pytest.raises(ScopeUnavailable):
            strict.launch(spec, CallerKind.CRON)
        launched = [
            inside.launch(spec, CallerKind.CRON),
            lenient.launch(spec, CallerKind.ONESHOT),
            strict.launch(spec, CallerKind.CLI),
            outside.launch(spec, CallerKind.KANBAN),
        ]
    placements = [x.placement for x in launched]
    assert placements == [Placement.DEGRADED] * 3 + [Placement.IN_PROCESS]
    for x in launched:
        assert (x.unit is None) and (bool(x.warning) == (x.placement is Placement.DEGRADED))
        x.process.wait(timeout=10)
    assert launched[0].warning and "cron.require_restart_safe_scope" in launched[0].warning


def test_a_lost_manager_flips_the_verdict_at_once(subject: Subject, tmp_path: Path) -> None:
    scoper = subject.make(in_unit=True)
    assert scoper.probe().ok  # a cached "up" verdict
    spec = _true(subject, tmp_path)
    with subject.unreachable():
        with pytest.raises(ManagerLost):
            scoper.launch(spec, CallerKind.CRON)
        assert not scoper.probe().ok  # no waiting for the TTL
        degraded = scoper.launch(spec, CallerKind.CRON)
        assert degraded.placement is Placement.DEGRADED
        degraded.process.wait(timeout=10)
