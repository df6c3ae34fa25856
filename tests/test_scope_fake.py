"""FakeScoper: the real placement table, real processes, fake units over process groups."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from scope.abc import CallerKind, LaunchSpec, Placement, Policy, Scoper
from scope.errors import ManagerLost, ScopeUnavailable
from scope.fake import FakeScoper
from scope.foundation.procstat import read_stat
from scope.unitname import is_ours
from tests.support.wait import wait_for

PY = sys.executable

# Honours the gate: prints what it read from the gate fd, then the variable's value.
GATED = (
    "import os,sys; fd=int(os.environ['DISPATCH_SCOPE_GATE_FD']); b=os.read(fd,1); "
    "sys.stdout.write(repr(b)); sys.stdout.flush()"
)
IGNORE_TERM = (
    "import signal,sys,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)"
)


def spec(argv: list[str], tmp_path, **kw) -> LaunchSpec:
    return LaunchSpec(argv=argv, env=dict(os.environ), cwd=str(tmp_path), **kw)


def test_is_a_scoper():
    assert isinstance(FakeScoper(), Scoper)


def test_scoped_launch_records_unit_and_runs_gated_program(tmp_path, leak_guard):
    scoper = FakeScoper()
    launched = scoper.launch(
        spec([PY, "-c", GATED], tmp_path, gated=True, stdout=subprocess.PIPE, unit_parts=("c1",)),
        CallerKind.KANBAN,
    )
    out, _ = launched.process.communicate(timeout=10)
    assert out == b"b'1'"
    assert launched.placement is Placement.SCOPED
    assert launched.unit is not None and is_ours(launched.unit)
    assert launched.unit.startswith("dispatch-kanban-c1-")
    assert launched.backend == "fake"
    assert scoper.launch_count == 1 and scoper.placements == {"scoped": 1}
    assert scoper.probe_count >= 1
    # Once the group is empty the "unit" is collected, like a real scope.
    assert scoper.unit_pids(launched.unit) is None


def test_stop_kills_a_sigterm_ignoring_group(tmp_path, leak_guard):
    scoper = FakeScoper()
    launched = scoper.launch(
        spec([PY, "-c", IGNORE_TERM], tmp_path, stdout=subprocess.PIPE), CallerKind.CRON
    )
    assert launched.process.stdout is not None
    assert launched.process.stdout.readline() == b"ready\n"
    assert launched.unit is not None
    assert scoper.unit_pids(launched.unit) == [launched.pid]
    result = scoper.stop(launched.unit, grace=0.2)
    assert result.stopped and result.signal == "SIGKILL" and not result.survivors
    assert launched.process.wait(timeout=5) == -9
    launched.process.stdout.close()
    assert scoper.stop(launched.unit, grace=0.1).stopped  # not loaded counts as stopped
    assert scoper.stop_count == 2


def test_refusal_and_degrade_follow_the_real_table(tmp_path, leak_guard, caplog):
    scoper = FakeScoper(in_teardown_unit=True, probe_ok=False, caller_unit="gw.service")
    with pytest.raises(ScopeUnavailable):
        scoper.launch(spec(["true"], tmp_path), CallerKind.KANBAN)
    assert scoper.launch_count == 0
    with caplog.at_level(logging.WARNING, logger="dispatch.scope"):
        first = scoper.launch(spec(["true"], tmp_path), CallerKind.CRON)
        second = scoper.launch(spec(["true"], tmp_path), CallerKind.CRON)
    for launched in (first, second):
        assert launched.placement is Placement.DEGRADED and launched.unit is None
        assert launched.warning and "KillMode=process" in launched.warning
        launched.process.wait(timeout=5)
    # Warned once per (caller kind, cause), not per process.
    assert len([r for r in caplog.records if "degraded" in r.getMessage()]) == 1
    scoper.policy = Policy(kanban_degrade_without_scope=True)
    launched = scoper.launch(spec(["true"], tmp_path), CallerKind.ONESHOT)
    assert launched.placement is Placement.DEGRADED
    launched.process.wait(timeout=5)


def test_outside_a_unit_without_scope_runs_in_process(tmp_path, leak_guard):
    scoper = FakeScoper(probe_ok=False)
    launched = scoper.launch(spec(["true"], tmp_path), CallerKind.KANBAN)
    assert launched.placement is Placement.IN_PROCESS and launched.warning is None
    launched.process.wait(timeout=5)
    scoper.probe_ok = True
    launched = scoper.launch(spec(["true"], tmp_path), CallerKind.CLI, wants_isolation=False)
    assert launched.placement is Placement.IN_PROCESS
    launched.process.wait(timeout=5)


def test_lost_manager_flips_the_verdict(tmp_path, leak_guard):
    scoper = FakeScoper(in_teardown_unit=True)
    scoper.lose_manager_on_next_launch()
    with pytest.raises(ManagerLost):
        scoper.launch(spec(["true"], tmp_path), CallerKind.CRON)
    assert scoper.probe_ok is False
    launched = scoper.launch(spec(["true"], tmp_path), CallerKind.CRON)
    assert launched.placement is Placement.DEGRADED
    launched.process.wait(timeout=5)


def test_stop_leaves_a_reused_group_alone(tmp_path, leak_guard):
    scoper = FakeScoper()
    launched = scoper.launch(spec(["sleep", "30"], tmp_path), CallerKind.CLI)
    assert launched.unit is not None
    # Forge a different start time: the group must no longer count as ours.
    fake = scoper._units[launched.unit]
    fake.leader_start += 1
    assert scoper.unit_pids(launched.unit) is None
    assert read_stat(launched.pid) is not None  # untouched
    launched.process.kill()
    launched.process.wait(timeout=5)
    wait_for(lambda: read_stat(launched.pid) is None, 5, what="child reaped")


def test_the_devnull_constant_is_subprocess_s() -> None:
    import subprocess

    from scope.abc import DEVNULL

    assert DEVNULL == subprocess.DEVNULL
