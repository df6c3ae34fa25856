"""The real scoper against a real systemd user manager (the ``systemd_manager`` fixture)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scope import open_scoper, policy_from
from scope.abc import BackendKind, CallerKind, LaunchSpec, Placement
from scope.cgroup import cgroup_procs
from scope.errors import ManagerLost, ScopeUnavailable
from scope.foundation.clock import FakeClock
from scope.foundation.procstat import start_time
from scope.settings import ScopeSettings
from scope.systemd import SystemdScoper
from tests.support.systemd import SystemdManager
from tests.support.wait import wait_for

pytestmark = pytest.mark.systemd

PY = sys.executable
BACKENDS = [BackendKind.DBUS, BackendKind.SYSTEMD_RUN]

# Reads the gate when it is given one (the keeper's protocol), then reports where it runs.
REPORT = """\
import json, os, sys
fd = os.environ.get("DISPATCH_SCOPE_GATE_FD")
if fd is not None:
    if os.read(int(fd), 1) != b"1":
        sys.exit(3)
    os.close(int(fd))
cgroup = [l[3:] for l in open("/proc/self/cgroup").read().splitlines() if l.startswith("0::")][0]
print(json.dumps({"pid": os.getpid(), "cgroup": cgroup, "cwd": os.getcwd(),
                  "foo": os.environ.get("FOO"), "gate": "DISPATCH_SCOPE_GATE_FD" in os.environ,
                  "runtime": os.environ.get("XDG_RUNTIME_DIR"),
                  "bus": os.environ.get("DBUS_SESSION_BUS_ADDRESS")}))
"""

# Ignores SIGTERM and leaves a double-forked, setsid'd grandchild that also ignores it.
STUBBORN = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
r, w = os.pipe()
middle = os.fork()
if middle == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode()); os.close(w)
        while True:
            time.sleep(1)
    os._exit(0)
os.close(w)
grandchild = os.read(r, 32).decode()
os.waitpid(middle, 0)  # gone before the test counts the scope's processes
print(grandchild, flush=True)
while True:
    time.sleep(1)
"""


@pytest.fixture
def scopers(systemd_manager: SystemdManager) -> Iterator[Callable[..., SystemdScoper]]:
    """Build scopers on the fixture's manager; all are closed after the test."""
    made: list[SystemdScoper] = []

    def make(
        backend: BackendKind = BackendKind.AUTO,
        *,
        clock: FakeClock | None = None,
        environ: dict[str, str] | None = None,
        in_unit: bool = False,
        cron_strict: bool = False,
        kanban_degrade: bool = False,
        **settings: object,
    ) -> SystemdScoper:
        env = dict(systemd_manager.env if environ is None else environ)
        env.pop("INVOCATION_ID", None)
        if in_unit:
            env["INVOCATION_ID"] = "0123456789abcdef"
        runtime_root = settings.pop("user_runtime_root", None)
        config = ScopeSettings(backend=backend, **settings)  # type: ignore[arg-type]
        policy = policy_from(cron_strict, kanban_degrade)
        if runtime_root is None:
            scoper = open_scoper(config, policy, environ=env, clock=clock)
        else:
            # A runtime root without /run/user/<uid>, so the fallback cannot rescue the test.
            scoper = SystemdScoper(
                config, policy, environ=env, clock=clock, user_runtime_root=str(runtime_root)
            )
        assert isinstance(scoper, SystemdScoper)
        made.append(scoper)
        return scoper

    yield make
    for scoper in made:
        scoper.close()


def report_spec(tmp_path: Path, **kw: object) -> LaunchSpec:
    env = {"PATH": os.environ.get("PATH", os.defpath), "FOO": "bar baz $HOME ;'\""}
    return LaunchSpec(
        argv=[PY, "-I", "-c", REPORT],
        env=env,
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        unit_parts=("c1", "run", "r7"),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("gated", [False, True], ids=["wrapped", "gated"])
@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_places_into_a_real_scope(scopers, tmp_path, backend, gated, leak_guard):
    scoper = scopers(backend)
    verdict = scoper.probe()
    assert verdict.ok, verdict
    launched = scoper.launch(report_spec(tmp_path, gated=gated), CallerKind.KANBAN)
    out, _ = launched.process.communicate(timeout=10)
    assert launched.process.returncode == 0
    seen = json.loads(out)
    assert launched.placement is Placement.SCOPED and launched.backend == backend.value
    assert launched.unit is not None and launched.unit.startswith("dispatch-kanban-c1-run-r7-")
    assert seen["cgroup"].endswith(f"/app.slice/{launched.unit}")
    assert seen["pid"] == launched.pid
    assert seen["foo"] == "bar baz $HOME ;'\"" and seen["cwd"] == str(tmp_path)
    # The worker sees the spec's environment, not what systemd-run or the gate needed.
    assert seen["runtime"] is None and seen["bus"] is None
    # Only the D-Bus backend gates; a gated program started by systemd-run gets no gate.
    assert seen["gate"] is (gated and backend is BackendKind.DBUS)
    scoper.close()


def test_missing_program_fails_like_popen(scopers, tmp_path):
    for backend in BACKENDS:
        scoper = scopers(backend)
        spec = LaunchSpec(argv=["no-such-program-xyz"], env={"PATH": "/usr/bin"}, cwd=str(tmp_path))
        with pytest.raises(FileNotFoundError):
            scoper.launch(spec, CallerKind.CLI)


def test_probe_is_cached_expires_and_is_single_flight(scopers):
    clock = FakeClock()
    scoper = scopers(clock=clock)
    first = scoper.probe()
    assert first.ok and first.backend == "dbus" and first.elapsed_ms > 0
    assert scoper.probe() == first and scoper.probe_runs == 1
    clock.advance(59)
    assert scoper.probe() == first and scoper.probe_runs == 1
    clock.advance(1)
    results = []
    threads = [threading.Thread(target=lambda: results.append(scoper.probe())) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 6 and all(r.ok for r in results)
    assert scoper.probe_runs == 2
    assert len({r.checked_at for r in results}) == 1


def test_probe_with_systemd_run_backend(scopers):
    verdict = scopers(BackendKind.SYSTEMD_RUN).probe()
    assert verdict.ok and verdict.backend == "systemd-run"


@pytest.mark.parametrize("backend", [*BACKENDS, BackendKind.AUTO], ids=str)
def test_lost_manager_flips_verdict_then_recovers(
    systemd_manager, scopers, tmp_path, backend, caplog
):
    clock = FakeClock()
    scoper = scopers(backend, clock=clock, in_unit=True)
    assert scoper.probe().ok
    spec = LaunchSpec(argv=["true"], env=systemd_manager.env, cwd=str(tmp_path))
    with systemd_manager.manager_unreachable():
        with pytest.raises(ManagerLost) as lost:
            scoper.launch(spec, CallerKind.CRON)
        assert "private" in lost.value.message and "loginctl enable-linger" in lost.value.message
        # The verdict flipped at once: no waiting for the TTL.
        verdict = scoper.probe()
        assert not verdict.ok and "vanished" in verdict.detail
        degraded = scoper.launch(spec, CallerKind.CRON)
        assert degraded.placement is Placement.DEGRADED and degraded.unit is None
        assert degraded.warning and "cron.require_restart_safe_scope" in degraded.warning
        degraded.process.wait(timeout=10)
        with pytest.raises(ScopeUnavailable) as refused:
            scoper.launch(spec, CallerKind.KANBAN)
        assert "kanban.degrade_without_scope" in refused.value.message
        # A fresh probe fails the same way through the real backend.
        clock.advance(60)
        assert not scoper.probe().ok
    # Reachable again, but the "down" verdict holds until its TTL passes.
    assert not scoper.probe().ok
    clock.advance(60)
    assert scoper.probe().ok
    again = scoper.launch(spec, CallerKind.CRON)
    assert again.placement is Placement.SCOPED
    again.process.wait(timeout=10)


def test_policy_when_no_scope_can_be_made(systemd_manager, scopers, tmp_path):
    clock = FakeClock()
    strict = scopers(clock=clock, in_unit=True, cron_strict=True)
    lenient = scopers(clock=clock, in_unit=True, kanban_degrade=True)
    outside = scopers(clock=clock)
    spec = LaunchSpec(argv=["true"], env=systemd_manager.env, cwd=str(tmp_path))
    with systemd_manager.manager_unreachable():
        assert not strict.probe().ok and not lenient.probe().ok and not outside.probe().ok
        with pytest.raises(ScopeUnavailable):
            strict.launch(spec, CallerKind.CRON)
        launched = [
            lenient.launch(spec, CallerKind.KANBAN),
            lenient.launch(spec, CallerKind.ONESHOT),
            strict.launch(spec, CallerKind.CLI),
            outside.launch(spec, CallerKind.KANBAN),
        ]
    assert [x.placement for x in launched] == [Placement.DEGRADED] * 3 + [Placement.IN_PROCESS]
    for x in launched:
        x.process.wait(timeout=10)


def test_symlinked_runtime_dir_is_rejected_even_though_it_works(systemd_manager, scopers, tmp_path):
    link = tmp_path / "rt"
    link.symlink_to(systemd_manager.runtime_dir)
    env = {**systemd_manager.env, "XDG_RUNTIME_DIR": str(link)}
    env.pop("DBUS_SESSION_BUS_ADDRESS")
    scoper = scopers(environ=env, user_runtime_root=str(tmp_path))
    verdict = scoper.probe()
    assert not verdict.ok and "symlink" in verdict.detail


@pytest.mark.parametrize("damage", ["world-writable", "foreign-owned"])
def test_unsafe_runtime_dir_is_rejected(systemd_manager, scopers, tmp_path, damage):
    runtime = systemd_manager.runtime_dir
    info = runtime.stat()
    if damage == "foreign-owned" and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    scoper = scopers(user_runtime_root=str(tmp_path), clock=FakeClock())
    assert scoper.probe().ok
    other = 65534 if info.st_uid != 65534 else 65533
    # Damage the live runtime dir briefly; the manager keeps running, only trust is withdrawn.
    if damage == "world-writable":
        runtime.chmod(0o777)
    else:
        os.chown(runtime, other, -1)
    try:
        verdict = scoper.probe(force=True)
    finally:
        runtime.chmod(info.st_mode & 0o7777)
        os.chown(runtime, info.st_uid, info.st_gid)
    expected = "world-writable" if damage == "world-writable" else f"owned by uid {other}"
    assert not verdict.ok and expected in verdict.detail
    assert scoper.probe(force=True).ok


@pytest.fixture
def reaper() -> Iterator[list[tuple[int, int]]]:
    """(pid, start time) of processes a test must not leave behind, even when it fails."""
    tracked: list[tuple[int, int]] = []
    yield tracked
    for pid, started in tracked:
        if start_time(pid) == started:  # still the same process: ours to kill
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def stubborn(scoper: SystemdScoper, tmp_path: Path, reaper: list[tuple[int, int]]):
    spec = LaunchSpec(
        argv=[PY, "-I", "-c", STUBBORN],
        env=dict(os.environ),
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
    )
    launched = scoper.launch(spec, CallerKind.KANBAN)
    reaper.append((launched.pid, start_time(launched.pid) or 0))
    assert launched.process.stdout is not None
    grandchild = int(launched.process.stdout.readline())
    reaper.append((grandchild, start_time(grandchild) or 0))
    assert launched.placement is Placement.SCOPED and launched.unit is not None
    return launched, grandchild


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_stop_kills_sigterm_ignoring_child_and_grandchild(
    systemd_manager, scopers, tmp_path, backend, reaper
):
    scoper = scopers(backend)
    launched, grandchild = stubborn(scoper, tmp_path, reaper)
    control_group = systemd_manager.unit_control_group(launched.unit)
    before = cgroup_procs(control_group, systemd_manager.cgroup_mount)
    assert launched.pid in before and grandchild in before
    assert sorted(scoper.unit_pids(launched.unit) or []) == before
    grace = 0.5
    started = time.monotonic()
    result = scoper.stop(launched.unit, grace=grace)
    elapsed = time.monotonic() - started
    assert result.stopped and result.signal == "SIGKILL" and not result.survivors
    assert elapsed < grace + 1.0
    assert cgroup_procs(control_group, systemd_manager.cgroup_mount) == []
    assert start_time(grandchild) is None
    assert launched.process.wait(timeout=5) == -9
    launched.process.stdout.close()
    wait_for(lambda: scoper.unit_pids(launched.unit) is None, 5, what="unit collected")
    # Stopping what is gone is success.
    assert scoper.stop(launched.unit, grace=0.1).stopped


def test_stop_of_a_cooperative_worker_needs_only_sigterm(scopers, tmp_path):
    scoper = scopers()
    spec = LaunchSpec(argv=["sleep", "30"], env=dict(os.environ), cwd=str(tmp_path))
    launched = scoper.launch(spec, CallerKind.CRON)
    assert launched.unit is not None
    result = scoper.stop(launched.unit, grace=5)
    assert result.stopped and result.signal == "SIGTERM"
    assert launched.process.wait(timeout=5) == -15


def test_stop_without_dbus_uses_systemctl(systemd_manager, scopers, tmp_path, reaper):
    scoper = scopers(BackendKind.AUTO)
    launched, grandchild = stubborn(scoper, tmp_path, reaper)
    # Hide only the bus: D-Bus is unusable, systemctl still reaches the private socket.
    bus = systemd_manager.bus_socket
    bus.rename(bus.with_name("bus.hidden"))
    try:
        assert scoper.unit_pids(launched.unit)
        result = scoper.stop(launched.unit, grace=0.3)
    finally:
        bus.with_name("bus.hidden").rename(bus)
    assert result.stopped and start_time(grandchild) is None
    launched.process.wait(timeout=5)
    launched.process.stdout.close()


def test_unknown_unit_is_not_loaded(scopers):
    scoper = scopers()
    assert scoper.unit_pids("dispatch-cli-never-existed.scope") is None
    assert scoper.stop("dispatch-cli-never-existed.scope", grace=0.1).stopped


def booted_view(manager) -> list[str]:
    """A command prefix that runs doctor where systemd is PID 1's init as far as doctor can
    tell: on a host without it, inside the private manager's mount namespace (which has
    /run/systemd/system), so "broken bus on a systemd host" is what the test sees."""
    if os.path.isdir("/run/systemd/system") or manager.manager_pid is None:
        return []
    return ["nsenter", "-m", "-t", str(manager.manager_pid)]


def doctor(env: dict[str, str], tmp_path: Path, prefix: list[str] = ()) -> tuple[int, dict]:
    env = {**env, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_STATE_HOME": str(tmp_path)}
    done = subprocess.run(
        [*prefix, PY, "-m", "dispatcher.cli.main", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_doctor_healthy(systemd_manager, tmp_path):
    code, report = doctor(systemd_manager.env, tmp_path)
    assert code == 0
    assert report["bus"]["ok"] and report["bus"]["path"] == str(systemd_manager.bus_socket)
    assert report["manager"] == {
        "reachable": True,
        "kind": "user",
        "version": systemd_manager.version,
    }
    assert report["probe"]["ok"] and report["probe"]["backend"] == "dbus"
    assert report["probe"]["elapsed_ms"] > 0
    assert set(report["placement"]) == {"gateway_cron", "gateway_kanban", "oneshot", "cli"}
    assert report["placement"]["gateway_kanban"] == "scoped"
    assert report["remedies"] == []


def test_doctor_broken(systemd_manager, tmp_path):
    empty = tmp_path / "run"
    empty.mkdir(mode=0o700)
    env = {**systemd_manager.env, "XDG_RUNTIME_DIR": str(empty)}
    env.pop("DBUS_SESSION_BUS_ADDRESS")
    prefix = booted_view(systemd_manager)
    code, report = doctor(env, tmp_path, prefix)
    assert code == 1
    assert report["bus"]["ok"] is False and report["manager"]["reachable"] is False
    assert report["probe"]["ok"] is False and report["probe"]["detail"]
    assert report["placement"] == {
        "gateway_cron": "degraded",
        "gateway_kanban": "refused",
        "oneshot": "refused",
        "cli": "in_process",
    }
    assert any("loginctl enable-linger" in r for r in report["remedies"])
    remedies = report["remedies"]
    assert len(remedies) == len(set(remedies)), remedies
    assert sum("enable-linger" in r for r in remedies) == 1, remedies
    assert not any(r.startswith("bus:") for r in remedies)  # symptoms are not remedies
    assert any(p.startswith("bus:") for p in report["problems"])
    human = subprocess.run(
        [*prefix, PY, "-m", "dispatcher.cli.main", "doctor"],
        env={**env, "XDG_CONFIG_HOME": str(tmp_path / "cfg")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert human.returncode == 1 and "loginctl enable-linger" in human.stdout
    assert "unhealthy" in human.stdout and human.stderr == ""


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_python_holder_when_no_shell_can_redirect(scopers, tmp_path, backend, monkeypatch):
    import scope.gate

    monkeypatch.setattr(scope.gate, "_bash", lambda: None)
    scoper = scopers(backend)
    launched = scoper.launch(report_spec(tmp_path), CallerKind.CRON)
    out, _ = launched.process.communicate(timeout=20)
    seen = json.loads(out)
    assert seen["cgroup"].endswith(f"/{launched.unit}") and seen["pid"] == launched.pid
    assert seen["runtime"] is None and not seen["gate"]


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_stderr_pipe_is_the_programs(scopers, tmp_path, backend):
    scoper = scopers(backend)
    spec = LaunchSpec(
        argv=["sh", "-c", "echo out; echo err >&2"],
        env={"PATH": os.environ["PATH"]},
        cwd=str(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    launched = scoper.launch(spec, CallerKind.CLI)
    out, err = launched.process.communicate(timeout=10)
    assert (out, err) == (b"out\n", b"err\n")


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_manager_refusal_is_translated(scopers, tmp_path, backend, leak_guard):
    from scope.errors import ScopeError
    from scope.translate import ScopeStartFailed

    scoper = scopers(backend)
    sleeper = scoper.launch(
        LaunchSpec(argv=["sleep", "30"], env=dict(os.environ), cwd=str(tmp_path)), CallerKind.CLI
    )
    assert sleeper.unit is not None
    # A second scope under the same name: the manager says no, nothing is left running.
    engine = scoper._backends[0]
    spec = LaunchSpec(argv=["sleep", "30"], env=dict(os.environ), cwd=str(tmp_path))
    with pytest.raises(ScopeError) as info:
        engine.launch(spec, sleeper.unit, scoper.settings.properties())
    assert isinstance(info.value, ScopeStartFailed)
    assert "already loaded" in info.value.message
    assert scoper.unit_pids(sleeper.unit) == [sleeper.pid]
    assert scoper.stop(sleeper.unit, grace=2).stopped
    sleeper.process.wait(timeout=5)
    scoper.close()


def test_dbus_reconnects_after_the_connection_drops(scopers, tmp_path, leak_guard):
    import socket as socketlib

    scoper = scopers(BackendKind.DBUS)
    spec = LaunchSpec(argv=["true"], env=dict(os.environ), cwd=str(tmp_path))
    first = scoper.launch(spec, CallerKind.CLI)
    first.process.wait(timeout=5)
    backend = scoper._dbus_backend
    conn = backend._conn  # type: ignore[union-attr]
    assert conn is not None and conn.alive
    # Cut the live connection from our side, as a bus restart would from the other.
    conn.bus._sock.shutdown(socketlib.SHUT_RDWR)
    wait_for(lambda: not conn.alive, 5, what="dbus-next notices the disconnect")
    again = scoper.launch(spec, CallerKind.CLI)
    assert again.placement is Placement.SCOPED and again.backend == "dbus"
    again.process.wait(timeout=5)
    assert backend._conn is not conn  # type: ignore[union-attr]
    scoper.close()


def test_degraded_warning_is_logged_once_per_caller_and_cause(
    systemd_manager, scopers, tmp_path, caplog
):
    scoper = scopers(clock=FakeClock(), in_unit=True)
    spec = LaunchSpec(argv=["true"], env=dict(os.environ), cwd=str(tmp_path))
    with systemd_manager.manager_unreachable(), caplog.at_level("WARNING", "dispatch.scope"):
        launched = [scoper.launch(spec, CallerKind.CRON) for _ in range(3)]
        launched.append(scoper.launch(spec, CallerKind.CLI))
    for x in launched:
        assert x.placement is Placement.DEGRADED and x.warning
        x.process.wait(timeout=5)
    degraded = [r for r in caplog.records if "runs degraded" in r.getMessage()]
    assert [r.getMessage().split()[0] for r in degraded] == ["cron", "cli"]


def test_concurrent_launches_share_one_connection(scopers, tmp_path, leak_guard):
    scoper = scopers(BackendKind.DBUS)
    # Eight first calls race to make the connection; only one may (a second would leak).
    queries = [
        threading.Thread(target=scoper.unit_pids, args=("dispatch-none.scope",)) for _ in range(8)
    ]
    for thread in queries:
        thread.start()
    for thread in queries:
        thread.join(30)
    spec = LaunchSpec(argv=["true"], env=dict(os.environ), cwd=str(tmp_path))
    results: list[object] = []

    def launch() -> None:
        try:
            launched = scoper.launch(spec, CallerKind.CRON)
            launched.process.wait(timeout=10)
            results.append(launched)
        except Exception as exc:  # reported below
            results.append(exc)

    threads = [threading.Thread(target=launch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(getattr(r, "placement", None) is Placement.SCOPED for r in results), results
    assert len({r.unit for r in results}) == 8  # type: ignore[attr-defined]
    scoper.close()  # the one connection and the loop thread go; leak_guard checks the fds
