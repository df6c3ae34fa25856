"""Events with real keepers and workers: completions, redelivery, heartbeats, watch patterns,
output sizing, ownership, pending work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from registry.abc import EventType, Owner, SessionState
from registry.environment import SERVICE_ENV
from registry.errors import HandoffRefused
from registry.keeper.files import SessionDir
from tests.support.leaks import LeakGuard
from tests.support.procs import ProcessIdentity, is_alive
from tests.support.wait import wait_for
from tests.test_events_support import (
    ECHO,
    fake_clock,
    of_type,
    registry_at,
    wait_log,
    wait_seen,
)
from tests.test_registry_support import REPO, request

ALICE = Owner(kind="client", id="alice")
BOB = Owner(kind="client", id="bob")


def sigkill(ident: ProcessIdentity) -> None:
    """SIGKILL this very process (pidfd first, identity re-checked through it)."""
    try:
        fd = os.pidfd_open(ident.pid)
    except ProcessLookupError:
        return
    try:
        if is_alive(ident):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)


# -- completions ------------------------------------------------------------------------------


def test_one_completion_per_session_under_a_kill_exit_race(
    tmp_path: Path, leak_guard: LeakGuard
) -> None:
    state = tmp_path / "state"
    # The gateway-like instance follows (it finalizes natural exits); a CLI-like instance kills.
    with registry_at(state) as gateway, registry_at(state, follow=False) as cli:
        outcomes = set()
        for attempt in range(20):
            # Exits spread around the moment the kill lands (10-20 ms after spawn returns
            # here); every sixth one surely outlives it.
            delay = (0.0, 0.005, 0.01, 0.015, 0.02, 5.0)[attempt % 6]
            session = gateway.spawn(
                request(["sh", "-c", f"sleep {delay}; echo bye; exit 5"], notify=True)
            )
            killed = cli.kill(session.id, grace=0.5).session
            final = gateway.wait(session.id, timeout=10).snapshot.session
            assert final == cli.get(session.id)
            events = gateway.events(session_id=session.id, include_acked=True)
            completions = [e for e in events if e.type is EventType.COMPLETION]
            assert len(completions) == 1, events
            done = completions[0]
            assert done.seq == max(e.seq for e in events)
            # The event says what the row says: no stale "exited" after a kill.
            assert (done.state, done.exit_code, done.signal, done.completion_reason) == (
                final.state,
                final.exit_code,
                final.signal,
                final.completion_reason,
            )
            assert killed.state is final.state
            if final.state is SessionState.EXITED:
                # It ended by itself before the kill's first signal: its own code, no signal.
                assert (final.exit_code, final.signal) == (5, None)
            else:
                assert final.state is SessionState.KILLED
                assert (final.completion_reason or "").startswith("killed by request")
            outcomes.add((final.state, final.signal))
        assert (SessionState.KILLED, "SIGTERM") in outcomes


def test_consumer_killed_before_acking_sees_the_event_again(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with registry_at(state) as registry:
        session = registry.spawn(
            request(["sh", "-c", "echo done; exit 0"], notify=True, owner=ALICE)
        )
        registry.wait(session.id, timeout=10)
    consumer = textwrap.dedent(
        f"""
        import json, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from tests.test_events_support import registry_at
        from pathlib import Path
        with registry_at(Path(sys.argv[1]), follow=False, cleanup=False) as registry:
            seen = [e.id for e in registry.events(owner="client:alice")]
            print(json.dumps(seen), flush=True)
            if sys.argv[2] == "crash":
                time.sleep(60)  # killed here: read, not acknowledged
            result = registry.ack(seen)
            print(json.dumps(list(result.acked)), flush=True)
        """
    )

    def run(mode: str) -> tuple[subprocess.Popen[str], list[str]]:
        proc = subprocess.Popen(
            [sys.executable, "-c", consumer, str(state), mode], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        return proc, json.loads(proc.stdout.readline())

    crashed, first = run("crash")
    assert len(first) == 1
    crashed.send_signal(signal.SIGKILL)
    crashed.wait(timeout=10)
    again, second = run("ack")
    assert second == first  # redelivered with the same id: deduplicated by id, not guessed
    out, _ = again.communicate(timeout=30)
    assert json.loads(out) == first  # acknowledged once, by this run
    last, third = run("ack")
    last.communicate(timeout=30)
    assert third == []
    with registry_at(state, follow=False) as registry:
        assert registry.ack(first).already == tuple(first)


def test_failed_start_and_lost_sessions_publish_their_completion(tmp_path: Path) -> None:
    with registry_at(tmp_path / "state", follow=False) as registry:
        session = registry.spawn(request(["no-such-program-xyz"], notify=True))
        (done,) = of_type(registry, session.id, EventType.COMPLETION)
        assert done.state is SessionState.FAILED_START
        assert "cannot run" in (done.completion_reason or "")
        doomed = registry.spawn(request(ECHO, notify=True))
        # The keeper dies first (no exit record can come), then the worker.
        for pid, start in (
            (doomed.keeper_pid, doomed.keeper_start),
            (doomed.worker_pid, doomed.worker_start),
        ):
            assert pid is not None and start is not None
            sigkill(ProcessIdentity(pid=pid, start_time=start))
        wait_for(lambda: registry.get(doomed.id).finished, 5, what="the lost session")
        (gone,) = of_type(registry, doomed.id, EventType.COMPLETION)
        assert gone.state is SessionState.LOST
        assert "keeper vanished" in (gone.completion_reason or "")


def test_pending_completions_is_zero_only_once_the_event_is_published(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with registry_at(state, follow=False) as registry:
        running = registry.spawn(request(ECHO, notify=True))
        ended = registry.spawn(request(["sh", "-c", "read x; exit 4"], notify=True))
        sdir = SessionDir(state / "sessions" / ended.id)
        sdir.write_stdin(b"\n", session_id=ended.id)
        wait_for(sdir.has_exit, 5, what="the exit record")
        # Finished on disk, but nobody has looked yet: no event so far.
        assert registry.store.get(ended.id).session.state is SessionState.RUNNING  # type: ignore[union-attr]
        assert of_type(registry, ended.id, EventType.COMPLETION) == []
        assert registry.pending_completions() == 0
        (done,) = of_type(registry, ended.id, EventType.COMPLETION)
        assert done.exit_code == 4
        assert of_type(registry, running.id, EventType.COMPLETION) == []
        registry.write_stdin(running.id, b"quit\n")
        registry.wait(running.id, timeout=10)
        assert len(of_type(registry, running.id, EventType.COMPLETION)) == 1


# -- output sizing ----------------------------------------------------------------------------


def test_completion_and_snapshots_carry_the_last_chars_with_an_exact_cut(tmp_path: Path) -> None:
    with registry_at(tmp_path / "state") as registry:
        script = "head -c 5000 /dev/zero | tr '\\0' a; printf 'é-END'"
        small = registry.spawn(request(["sh", "-c", script], notify=True, output_chars=100))
        default = registry.spawn(request(["sh", "-c", script], notify=True))
        snap = registry.wait(small.id, timeout=10).snapshot
        assert snap.output == "a" * 95 + "é-END" and snap.output_cut == 4905
        (done,) = of_type(registry, small.id, EventType.COMPLETION)
        assert (done.output, done.output_cut) == (snap.output, snap.output_cut)
        assert done.log_path == small.log_path
        registry.wait(default.id, timeout=10)
        (full,) = of_type(registry, default.id, EventType.COMPLETION)
        assert len(full.output) == 2000 and full.output_cut == 5005 - 2000
        assert registry.poll(default.id).output == full.output


# -- heartbeats -------------------------------------------------------------------------------


def test_heartbeat_deltas_concatenated_equal_the_output(
    tmp_path: Path, leak_guard: LeakGuard
) -> None:
    clock = fake_clock()
    with registry_at(tmp_path / "state", clock) as registry:
        session = registry.spawn(request(ECHO, notify=True, heartbeat=5))
        assert session.heartbeat == 60.0  # raised to the floor
        written = b""
        for chunk in (b"first", b"second \xc3\xa9t\xc3\xa9", b"", b"third"):
            if chunk:
                registry.write_stdin(session.id, chunk + b"\n")
                written += chunk + b"\n"
            wait_log(registry, session.id, written)
            clock.advance(30)
            registry.notifier.tick()  # not due yet
            clock.advance(30)
            registry.notifier.tick()
        registry.write_stdin(session.id, b"quit\n")
        registry.wait(session.id, timeout=10)
        beats = of_type(registry, session.id, EventType.HEARTBEAT)
        assert len(beats) == 3  # the quiet interval sent nothing (no liveness heartbeats)
        assert "".join(b.output for b in beats).encode() == written == registry.read_log(session.id)
        assert [b.data["bytes"] for b in beats] == [6, 13, 6]
        (done,) = of_type(registry, session.id, EventType.COMPLETION)
        assert done.seq == beats[-1].seq + 1  # the completion follows the last heartbeat
        clock.advance(120)
        registry.notifier.tick()
        assert len(of_type(registry, session.id, EventType.HEARTBEAT)) == 3  # stopped at exit


def test_liveness_heartbeat_and_a_character_split_across_writes(tmp_path: Path) -> None:
    clock = fake_clock()
    with registry_at(tmp_path / "state", clock) as registry:
        session = registry.spawn(request(ECHO, heartbeat=60, heartbeat_liveness=True))
        clock.advance(60)
        registry.notifier.tick()
        (idle,) = of_type(registry, session.id, EventType.HEARTBEAT)
        assert idle.output == "" and idle.data["liveness_only"] is True
        # A worker that writes half of "é": the heartbeat holds the byte back for the next.
        registry.kill(session.id, grace=0.2)
        split = registry.spawn(
            request(["sh", "-c", "printf 'x\\303'; read a; printf '\\251y'; read b"], heartbeat=60)
        )
        wait_log(registry, split.id, b"x\xc3")
        clock.advance(60)
        registry.notifier.tick()
        registry.write_stdin(split.id, b"\n")
        wait_log(registry, split.id, b"x\xc3\xa9y")
        clock.advance(60)
        registry.notifier.tick()
        beats = of_type(registry, split.id, EventType.HEARTBEAT)
        assert [b.output for b in beats] == ["x", "éy"]


def test_heartbeats_resume_after_adoption_and_one_registry_emits(tmp_path: Path) -> None:
    clock = fake_clock()
    state = tmp_path / "state"
    with registry_at(state, clock, cleanup=False) as first:
        session = first.spawn(request(ECHO, heartbeat=90))
        first.write_stdin(session.id, b"one\n")
        wait_log(first, session.id, b"one\n")
        with registry_at(state, clock, cleanup=False) as second:
            assert second.adopt()  # follows it too, but the first one emits
            clock.advance(90)
            first.notifier.tick()
            second.notifier.tick()
            assert [b.output for b in of_type(first, session.id, EventType.HEARTBEAT)] == ["one\n"]
    # The launcher is gone (closing is not a teardown: the worker runs on).
    with registry_at(state, clock) as adopter:
        assert adopter.get(session.id).state is SessionState.RUNNING
        adopter.write_stdin(session.id, b"two\n")
        wait_log(adopter, session.id, b"one\ntwo\n")
        adopter.adopt()
        clock.advance(89)
        adopter.notifier.tick()
        assert len(of_type(adopter, session.id, EventType.HEARTBEAT)) == 1  # interval kept
        clock.advance(1)
        adopter.notifier.tick()
        beats = of_type(adopter, session.id, EventType.HEARTBEAT)
        assert [b.output for b in beats] == ["one\n", "two\n"]
        assert beats[1].data["interval"] == 90


# -- watch patterns ---------------------------------------------------------------------------


def test_watch_pattern_split_across_two_writes_matches(tmp_path: Path) -> None:
    with registry_at(tmp_path / "state") as registry:
        session = registry.spawn(
            request(
                ["sh", "-c", "printf 'ERR'; read a; printf 'OR: disk full\\nfine\\n'; read b"],
                watch=["ERROR"],
            )
        )
        wait_log(registry, session.id, b"ERR")
        wait_for(lambda: registry.tracking.follower is not None, 1)
        registry.write_stdin(session.id, b"\n")
        hits = wait_for(lambda: of_type(registry, session.id, EventType.WATCH), 5, what="a match")
        assert [h.output for h in hits] == ["ERROR: disk full"]
        assert hits[0].data["patterns"] == ["ERROR"]
        registry.write_stdin(session.id, b"\n")
        registry.wait(session.id, timeout=10)
        # No notify asked: the watch events are all the owner gets.
        assert of_type(registry, session.id, EventType.COMPLETION) == []


def test_watch_cooldown_strikes_then_falls_back_to_notify(tmp_path: Path) -> None:
    clock = fake_clock()
    with registry_at(tmp_path / "state", clock, watch_strikes=2) as registry:
        session = registry.spawn(request(ECHO, watch=[r"re:unused", "ALERT"]))

        def say(line: str) -> None:
            registry.write_stdin(session.id, line.encode() + b"\n")

        def watch_events() -> list[str]:
            return [
                e.type.value
                for e in registry.events(session_id=session.id, include_acked=True)
                if e.type in (EventType.WATCH, EventType.WATCH_DISABLED)
            ]

        say("ALERT 1")
        wait_for(lambda: watch_events() == ["watch"], 5, what="the first watch event")
        say("ALERT 2")  # within the cooldown: suppressed, a strike when the window closes
        wait_seen(registry, session.id, "ALERT 1\nALERT 2\n")
        registry.notifier.tick()
        clock.advance(15)
        say("ALERT 3")
        wait_for(lambda: watch_events() == ["watch"] * 2, 5, what="the second watch event")
        second = of_type(registry, session.id, EventType.WATCH)[1]
        assert second.data["suppressed"] == 1 and second.output == "ALERT 3"
        say("ALERT 4")
        wait_seen(registry, session.id, "ALERT 3\nALERT 4\n")
        registry.notifier.tick()
        clock.advance(15)
        say("ALERT 5")  # the second window with drops: watching stops
        wait_for(lambda: watch_events() == ["watch", "watch", "watch_disabled"], 5)
        (off,) = of_type(registry, session.id, EventType.WATCH_DISABLED)
        assert off.data["fallback"] == "notify" and "registry.watch_strikes" in off.data["reason"]
        assert registry.get(session.id).notify is True
        say("ALERT 6")
        say("quit")
        registry.wait(session.id, timeout=10)
        (done,) = of_type(registry, session.id, EventType.COMPLETION)
        assert done.data["watch"]["suppressed_total"] >= 3
        assert watch_events() == ["watch", "watch", "watch_disabled"]


# -- ownership --------------------------------------------------------------------------------


def test_handoff_routes_events_and_the_note_rides_on_the_completion(tmp_path: Path) -> None:
    with registry_at(tmp_path / "state") as registry:
        session = registry.spawn(request(ECHO, notify=True, owner=ALICE))
        with pytest.raises(HandoffRefused):
            registry.handoff(session.id, BOB, note="review", by=BOB)
        moved = registry.handoff(session.id, BOB, note="finish the review", by=ALICE)
        assert moved.owner == BOB and moved.handoff_from == ALICE
        (given,) = registry.events(owner=BOB)
        assert given.type is EventType.HANDOFF and given.note == "finish the review"
        assert given.data == {"from": "client:alice", "to": "client:bob"}
        assert registry.events(owner=ALICE) == []
        registry.write_stdin(session.id, b"quit\n")
        registry.wait(session.id, timeout=10)
        done = registry.events(owner=BOB)[-1]
        assert done.type is EventType.COMPLETION
        assert done.note == "finish the review" and done.data["handoff_from"] == "client:alice"


def test_an_owner_hands_off_at_most_three_sessions(tmp_path: Path) -> None:
    with registry_at(tmp_path / "state") as registry:
        sessions = [registry.spawn(request(ECHO, owner=ALICE)) for _ in range(4)]
        for s in sessions[:3]:
            registry.handoff(s.id, BOB, note="yours")
        with pytest.raises(HandoffRefused, match="already handed off 3"):
            registry.handoff(sessions[3].id, BOB, note="yours")
        assert registry.get(sessions[3].id).owner == ALICE


def test_teardown_kills_owned_sessions_and_reports_unread_completions(tmp_path: Path) -> None:
    with registry_at(tmp_path / "state") as registry:
        ended = registry.spawn(request(["sh", "-c", "exit 2"], notify=True, owner=ALICE))
        registry.wait(ended.id, timeout=10)
        busy = registry.spawn(request(ECHO, notify=True, owner=ALICE))
        other = registry.spawn(request(ECHO, owner=BOB))
        report = registry.teardown_owner(ALICE, grace=0.3)
        assert [s.session.id for s in report.orphaned] == [busy.id]
        assert report.orphaned[0].session.state is SessionState.KILLED
        assert "orphaned" in (report.orphaned[0].session.completion_reason or "")
        assert {e.session_id for e in report.unread} == {ended.id, busy.id}
        assert all(e.type is EventType.COMPLETION for e in report.unread)
        assert of_type(registry, busy.id, EventType.ORPHANED)
        assert registry.events(owner=ALICE) == []  # the report took them
        assert registry.get(other.id).state is SessionState.RUNNING


# -- environment ------------------------------------------------------------------------------


def test_systemd_service_variables_never_reach_a_worker(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.update({name: "1" for name in SERVICE_ENV})
    env["KEEP_ME"] = "yes"
    with registry_at(tmp_path / "state") as registry:
        session = registry.spawn(request(["env"], env=env))
        registry.wait(session.id, timeout=10)
        names = {
            line.split("=", 1)[0] for line in registry.read_log(session.id).decode().split("\n")
        }
    assert "KEEP_ME" in names
    assert names.isdisjoint(SERVICE_ENV)
