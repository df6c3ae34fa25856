"""ProcessRegistry with real keepers and real workers, placed in_process (no systemd needed),
over both start paths (every registry and launcher here starts its keepers one way or the
other: see tests/support/keepers.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from registry.abc import Owner, Session, SessionState, WaitOutcome
from registry.errors import RegistryError
from registry.proc.identity import Identity, alive
from registry.process import ProcessRegistry
from scope.fake import FakeScoper
from scope.foundation.clock import FakeClock
from scope.foundation.errors import NotFoundError, UsageError
from scope.foundation.ids import AmbiguousId
from tests.support.keepers import over_both_start_paths  # noqa: F401 - autouse, parametrized
from tests.support.leaks import LeakGuard
from tests.support.wait import wait_for
from tests.test_registry_support import (
    DOUBLE_FORK,
    EXIT_3,
    IGNORES_TERM,
    SLEEPER,
    open_registry,
    request,
    session_pids,
    start_launcher,
    stop_all,
)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ProcessRegistry]:
    with open_registry(tmp_path / "state") as reg:
        yield reg


def test_spawn_wait_exit_code_and_output(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(EXIT_3))
    # A worker this quick may already have ended when spawn returns; both are truthful.
    assert session.state in (SessionState.RUNNING, SessionState.EXITED)
    assert session.id.startswith("s_") and len(session.id) == 14
    assert session.keeper_pid and session.worker_pid and session.worker_start
    result = registry.wait(session.id, timeout=10)
    assert result.outcome is WaitOutcome.FINISHED
    done = result.snapshot.session
    assert done.state is SessionState.EXITED
    assert done.exit_code == 3 and done.signal is None
    assert done.completion_reason == "exited with code 3"
    assert done.finished_at is not None and done.started_at is not None
    assert done.finished_at >= done.started_at
    assert result.snapshot.output == "out\nerr\n"
    assert registry.read_log(session.id) == b"out\nerr\n"
    assert done.total_bytes == 8
    log = Path(done.log_path)
    assert log.stat().st_mode & 0o777 == 0o600
    assert log.parent.stat().st_mode & 0o777 == 0o700


def test_ten_megabytes_byte_exact(registry: ProcessRegistry, tmp_path: Path) -> None:
    payload = tmp_path / "payload"
    chunk = bytes(range(256)) * 4096  # every byte value, NULs included
    with open(payload, "wb") as f:
        for i in range(10):
            f.write(chunk[i:] + chunk[:i])
    session = registry.spawn(request(["cat", str(payload)]))
    done = registry.wait(session.id, timeout=60).snapshot.session
    assert done.exit_code == 0
    assert Path(done.log_path).read_bytes() == payload.read_bytes()
    assert done.total_bytes == payload.stat().st_size == 10 * 1024 * 1024


def test_a_worker_holds_only_its_stdio(registry: ProcessRegistry) -> None:
    # Nothing of the registry, its fork server or the keeper reaches the worker.
    session = registry.spawn(request(["sh", "-c", "ls /proc/$$/fd"]))
    assert registry.wait(session.id, timeout=10).snapshot.output.split() == ["0", "1", "2"]


def test_invalid_utf8_and_nul_are_kept_raw_and_replaced_in_text(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(["sh", "-c", "printf 'a\\000b\\377\\376c\\342\\234'"]))
    snap = registry.wait(session.id, timeout=10).snapshot
    assert registry.read_log(session.id) == b"a\x00b\xff\xfec\xe2\x9c"
    assert snap.output == "a\x00b\ufffd\ufffdc\ufffd"


@pytest.mark.parametrize(
    ("argv", "cwd", "words"),
    [
        (["no-such-binary-xyz"], "/", "cannot run 'no-such-binary-xyz'"),
        (["true"], "/no/such/dir", "working directory '/no/such/dir'"),
    ],
)
def test_failed_start(registry: ProcessRegistry, argv: list[str], cwd: str, words: str) -> None:
    seen: list[Session] = []
    registry.add_finish_listener(seen.append)
    session = registry.spawn(request(argv, cwd=cwd))
    assert session.state is SessionState.FAILED_START
    assert words in (session.completion_reason or "")
    assert session.exit_code is None
    assert [s.id for s in seen] == [session.id]


def test_sigterm_ignoring_worker_is_killed_with_the_real_signal(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(IGNORES_TERM))
    wait_for(lambda: registry.read_log(session.id) == b"ready\n", 5, what="worker ready")
    started = time.monotonic()
    snap = registry.kill(session.id, grace=0.3)
    assert time.monotonic() - started < 5
    done = snap.session
    assert done.state is SessionState.KILLED
    assert done.signal == "SIGKILL"
    assert session_pids(session.id) == []
    assert not alive(Identity(pid=done.worker_pid or 0, start=done.worker_start or 0))
    assert "killed by request" in (done.completion_reason or "")


def test_double_forked_grandchild_is_killed_too(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(DOUBLE_FORK))
    wait_for(lambda: len(session_pids(session.id)) >= 3, 5, what="the grandchild")
    grandchildren = session_pids(session.id)
    snap = registry.kill(session.id, grace=0.3)
    assert snap.session.state is SessionState.KILLED
    assert snap.session.signal == "SIGTERM"  # the worker itself died of the first signal
    assert session_pids(session.id) == []
    for pid in grandchildren:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(
            ") "
        )[1].startswith(("Z", "X"))


def test_pty_worker_input_and_kill(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(["cat"], pty=True))
    assert session.pty
    registry.write_stdin(session.id, b"hello pty\n")
    wait_for(lambda: registry.poll(session.id).output.count("hello pty") == 2, 5, what="echo")
    snap = registry.kill(session.id)
    assert snap.session.state is SessionState.KILLED
    assert snap.session.signal in ("SIGTERM", "SIGHUP")
    assert session_pids(session.id) == []
    with pytest.raises(RegistryError):
        registry.write_stdin(session.id, b"late\n")


def test_pipe_worker_reads_stdin_from_any_writer(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(["sh", "-c", "read line; echo got:$line"]))
    registry.write_stdin(session.id, b"abc\n")
    done = registry.wait(session.id, timeout=10).snapshot
    assert done.output == "got:abc\n"


def test_killing_a_finished_session_is_success(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(["true"]))
    registry.wait(session.id, timeout=10)
    snap = registry.kill(session.id)
    assert snap.session.state is SessionState.EXITED
    assert snap.session.exit_code == 0


def test_kill_racing_a_natural_exit_records_the_truth(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(["sh", "-c", "exit 9"]))
    wait_for(lambda: Path(session.log_path).with_name("exit.json").exists(), 5, what="exit")
    snap = registry.kill(session.id)
    assert snap.session.state is SessionState.EXITED
    assert snap.session.exit_code == 9


def test_a_kill_stamps_the_injected_clock(tmp_path: Path) -> None:
    # A fake clock far from the real one: every time the kill records must be the clock's.
    clock = FakeClock(start=time.time() - 86_400)
    with open_registry(tmp_path / "state", clock=clock) as registry:
        session = registry.spawn(request(SLEEPER))
        clock.advance(5.0)
        snap = registry.kill(session.id, grace=5.0, reason="test kill")
        stored = registry.store.get(session.id)
    assert snap.session.state is SessionState.KILLED and snap.session.signal == "SIGTERM"
    assert stored is not None and stored.kill is not None
    assert stored.kill.requested_at == clock.time()
    assert stored.kill.signalled_at == clock.time()
    assert stored.kill.reason == "test kill"


def test_session_timeout_kills_and_records_timed_out(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(IGNORES_TERM, timeout=0.3))
    done = registry.wait(session.id, timeout=10).snapshot.session
    assert done.state is SessionState.TIMED_OUT
    assert done.signal == "SIGKILL"
    assert session_pids(session.id) == []


def test_wait_timeout_and_interrupt_leave_the_worker_running(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(SLEEPER))
    result = registry.wait(session.id, timeout=0.1)
    assert result.outcome is WaitOutcome.TIMEOUT
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    result = registry.wait(session.id, timeout=10, interrupt=stop)
    assert result.outcome is WaitOutcome.INTERRUPTED
    assert registry.poll(session.id).session.state is SessionState.RUNNING
    assert registry.kill(session.id).session.state is SessionState.KILLED


def test_exit_recorded_while_a_descendant_holds_the_output(tmp_path: Path) -> None:
    with open_registry(tmp_path / "state", drain_time=5.0) as registry:
        session = registry.spawn(request(["sh", "-c", "(sleep 1; echo late) & echo early; exit 4"]))
        started = time.monotonic()
        done = registry.wait(session.id, timeout=10).snapshot
        assert time.monotonic() - started < 0.9  # the completion did not wait for the drain
        assert done.session.exit_code == 4
        wait_for(lambda: registry.read_log(session.id) == b"early\nlate\n", 5, what="late output")


def test_ids_resolve_by_prefix(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(["true"]))
    assert registry.resolve(session.id).id == session.id
    assert registry.resolve(session.id[:6]).id == session.id
    assert registry.resolve(session.id[2:7]).id == session.id
    assert registry.resolve(session.id[:4]).id == session.id  # 4 characters as typed
    with pytest.raises(UsageError):
        registry.resolve(session.id[:3])  # too short
    with pytest.raises(NotFoundError):
        registry.resolve("nosuch")
    with pytest.raises(NotFoundError):
        registry.get("s_000000000000")


def test_ambiguous_prefix_lists_candidates(registry: ProcessRegistry) -> None:
    # Ids are random; give two sessions ids that share a prefix.
    first = registry.spawn(request(["true"])).id
    second = registry.spawn(request(["true"])).id
    registry.wait(first, timeout=10)
    registry.wait(second, timeout=10)
    with registry.store.db.write() as conn:
        for old, new in ((first, "s_abcd00000001"), (second, "s_abcd00000002")):
            conn.execute("UPDATE registry_sessions SET id = ? WHERE id = ?", (new, old))
    with pytest.raises(AmbiguousId) as caught:
        registry.resolve("abcd")
    assert caught.value.fields["candidates"] == ["s_abcd00000001", "s_abcd00000002"]
    assert caught.value.exit_code == 2
    assert registry.resolve("s_abcd00000002").id == "s_abcd00000002"


def test_listeners_fire_once_and_ps_lists(registry: ProcessRegistry) -> None:
    seen: list[str] = []
    registry.add_finish_listener(lambda s: seen.append(s.id))
    first = registry.spawn(request(["true"]))
    second = registry.spawn(request(SLEEPER))
    registry.wait(first.id, timeout=10)
    wait_for(lambda: seen == [first.id], 5, what="listener")
    assert [s.id for s in registry.list_sessions()] == [second.id]
    assert {s.id for s in registry.list_sessions(include_finished=True)} == {first.id, second.id}
    registry.kill(second.id)
    wait_for(lambda: sorted(seen) == sorted([first.id, second.id]), 5, what="listener")
    time.sleep(0.2)  # a late duplicate call would show up here
    assert len(seen) == 2


def test_read_log_selectors(registry: ProcessRegistry) -> None:
    session = registry.spawn(request(["sh", "-c", "printf 'a\\nb\\nc\\nd'"]))
    registry.wait(session.id, timeout=10)
    assert registry.read_log(session.id, head=3) == b"a\nb"
    assert registry.read_log(session.id, tail_lines=2) == b"c\nd"
    assert registry.read_log(session.id, byte_range=(2, 5)) == b"b\nc"
    assert registry.read_log(session.id, tail_lines=0) == b""


def test_two_hundred_spawn_cycles_leave_no_leaks(tmp_path: Path, leak_guard: LeakGuard) -> None:
    with open_registry(tmp_path / "state") as registry:
        for _ in range(200):
            session = registry.spawn(request(["true"]))
            assert registry.wait(session.id, timeout=10).snapshot.session.exit_code == 0
        wait_for(lambda: not registry.tracking.children, 5, what="keepers reaped")


def test_launcher_killed_worker_finishes_fresh_registry_adopts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    go = tmp_path / "go"
    script = f"echo before; while [ ! -e {go} ]; do sleep 0.02; done; echo after; exit 3"
    launcher, info = start_launcher(state, ["sh", "-c", script])
    assert info["placement"] == "in_process"
    try:
        wait_for(
            lambda: (
                (state / "sessions" / info["id"] / "output.log").exists()
                and (state / "sessions" / info["id"] / "output.log").read_bytes() == b"before\n"
            ),
            10,
            what="first output",
        )
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        go.touch()
        with open_registry(state) as registry:
            registry.adopt()
            done = registry.wait(info["id"], timeout=10).snapshot
            assert done.session.state is SessionState.EXITED
            assert done.session.exit_code == 3
            assert done.session.finished_at is not None
            assert done.output == "before\nafter\n"
            assert registry.read_log(info["id"]) == b"before\nafter\n"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        stop_all(state)


def test_a_launcher_killed_before_recording_its_keeper_starts_no_worker(tmp_path: Path) -> None:
    """Killed once the keeper is launched (past its scope gate) but before its pid is stored,
    the launcher leaves a draft row, and the keeper exits at its record gate: nothing runs
    behind a row that a restarted dispatcher reads as "never started" (and may start again)."""
    state = tmp_path / "state"
    ran = tmp_path / "ran"
    argv = [sys.executable, "-c", f"open({str(ran)!r}, 'w').close()"]
    launcher, info = start_launcher(state, argv, die_before_record=True)
    assert launcher.wait(timeout=10) == -signal.SIGKILL
    keeper = psutil.Process(info["keeper_pid"])

    def keeper_gone() -> bool:
        try:
            return keeper.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(keeper_gone, 10, what="the keeper turned back at its record gate")
    assert not ran.exists()
    with open_registry(state, follow=False) as registry:
        draft = registry.get(info["id"])
        assert draft.keeper_pid is None and draft.worker_pid is None
        assert session_pids(info["id"]) == []


def test_timeout_holds_after_the_launcher_died(tmp_path: Path) -> None:
    state = tmp_path / "state"
    launcher, info = start_launcher(state, IGNORES_TERM, timeout=0.5)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=10)
    with open_registry(state, follow=False) as registry:
        done = registry.wait(info["id"], timeout=15).snapshot.session
        assert done.state is SessionState.TIMED_OUT
        assert done.signal == "SIGKILL"
        assert session_pids(info["id"]) == []


def test_adopt_finalizes_finished_and_marks_vanished_lost(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with open_registry(state, follow=False, cleanup=False) as registry:
        finished = registry.spawn(request(["sh", "-c", "sleep 0.3; exit 2"]))
        vanished = registry.spawn(request(SLEEPER))
        wait_for(lambda: Path(finished.log_path).with_name("exit.json").exists(), 5, what="exit")
        os.kill(vanished.keeper_pid or 0, signal.SIGKILL)
        os.kill(vanished.worker_pid or 0, signal.SIGKILL)
        child = registry.tracking.child(vanished.id)  # ours, or reaped by the fork server
        if child is not None:
            child.wait(timeout=5)  # reaped: the pid is free again
        keeper = Identity(pid=vanished.keeper_pid or 0, start=vanished.keeper_start or 0)
        wait_for(lambda: not alive(keeper), 5, what="the keeper gone")
    with open_registry(state) as fresh:
        seen: list[str] = []
        fresh.add_finish_listener(lambda s: seen.append(s.id))
        changed = {s.id: s for s in fresh.adopt()}
        assert changed[finished.id].state is SessionState.EXITED
        assert changed[finished.id].exit_code == 2
        assert changed[vanished.id].state is SessionState.LOST
        assert "keeper vanished without an exit record" in (
            changed[vanished.id].completion_reason or ""
        )
        assert sorted(seen) == sorted([finished.id, vanished.id])
        assert fresh.adopt() == []


def test_two_registries_finalize_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    calls: list[str] = []
    with open_registry(state) as one, open_registry(state) as two:
        one.add_finish_listener(lambda s: calls.append("one"))
        two.add_finish_listener(lambda s: calls.append("two"))
        session = one.spawn(request(["sh", "-c", "sleep 0.2"]))
        two.adopt()
        one.wait(session.id, timeout=10)
        two.wait(session.id, timeout=10)
        wait_for(lambda: sorted(calls) == ["one", "two"], 5, what="both instances told")


def test_prune_keeps_logs_that_history_references(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with open_registry(state, finished_ttl=3600.0, log_retention=7200.0) as registry:
        plain = registry.spawn(request(["true"]))
        cron = registry.spawn(request(["true"], owner=Owner(kind="cron", id="job@1")))
        running = registry.spawn(request(SLEEPER))
        for s in (plain, cron):
            registry.wait(s.id, timeout=10)
        now = time.time()
        assert registry.prune(now=now) == 0
        assert registry.prune(now=now + 5000) == 2
        assert {s.id for s in registry.list_sessions(include_finished=True)} == {running.id}
        assert not Path(plain.log_path).parent.exists()
        assert Path(cron.log_path).exists()  # kept for the cron history
        registry.prune(now=now + 8000)
        assert not Path(cron.log_path).parent.exists()
        registry.kill(running.id)


def test_prune_caps_the_number_of_finished_sessions(tmp_path: Path) -> None:
    with open_registry(tmp_path / "state", max_sessions=10) as registry:
        ids = []
        for _ in range(12):
            s = registry.spawn(request(["true"]))
            registry.wait(s.id, timeout=10)
            ids.append(s.id)
        assert registry.prune() == 2
        left = {s.id for s in registry.list_sessions(include_finished=True)}
        assert len(left) == 10


def test_spawn_refused_by_policy_leaves_nothing(tmp_path: Path) -> None:
    from scope.abc import CallerKind, Policy
    from scope.errors import ScopeUnavailable

    scoper = FakeScoper(in_teardown_unit=True, probe_ok=False, policy=Policy())
    with open_registry(tmp_path / "state", scoper) as registry:
        with pytest.raises(ScopeUnavailable):
            registry.spawn(request(["true"], caller=CallerKind.KANBAN))
        assert registry.list_sessions(include_finished=True) == []
        assert list((tmp_path / "state" / "sessions").iterdir()) == []


def test_string_argv_needs_shell(registry: ProcessRegistry) -> None:
    with pytest.raises(UsageError):
        registry.spawn(request("echo hi"))
    with pytest.raises(UsageError):
        registry.spawn(request(["echo", "hi"], shell=True))
    session = registry.spawn(request("echo $((6*7))", shell=True))
    assert registry.wait(session.id, timeout=10).snapshot.output == "42\n"
    assert session.argv == ("/bin/sh", "-c", "echo $((6*7))")


def test_unfollowed_registry_sees_the_end_from_files(tmp_path: Path) -> None:
    with open_registry(tmp_path / "state", follow=False) as registry:
        session = registry.spawn(request(EXIT_3))
        done = registry.wait(session.id, timeout=10)
        assert done.snapshot.session.exit_code == 3
        assert done.snapshot.output == "out\nerr\n"
        # Reads reap the keeper (our child) once it is gone: no zombie is left behind.
        wait_for(lambda: not registry.poll(session.id) or not registry.tracking.children, 5)
