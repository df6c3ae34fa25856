"""The registry contract (registry/abc.py), run against every implementation.

* ``fake``: :class:`registry.fake.FakeRegistry` (in memory; a test ends its sessions);
* ``process``: :class:`registry.process.ProcessRegistry` with real keepers and processes;
* ``systemd``: the same, placed in real scopes by a private systemd user manager (the
  ``systemd`` tier: skipped without one, a failure in CI);
* ``process-forked`` and ``systemd-forked``: both again with keepers forked by the fork server
  (tests/support/keepers.py) instead of started as fresh interpreters.

A later backend is one more parameter of :func:`subject`. Each test states a promise of the
contract; implementation details (keeper files, unit names) are tested elsewhere.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from registry.abc import (
    Event,
    EventType,
    Owner,
    Registry,
    Session,
    SessionState,
    SpawnRequest,
    WaitOutcome,
)
from registry.errors import HandoffRefused
from registry.fake import FakeRegistry
from registry.settings import RegistrySettings
from scope import open_scoper
from scope.abc import Placement, Policy, Scoper
from scope.foundation.clock import FakeClock
from scope.foundation.errors import NotFoundError, UsageError
from scope.foundation.ids import AmbiguousId, IdKind, IdTooShort
from scope.resources import ScopeProperties
from scope.settings import ScopeSettings
from tests.support.keepers import start_path
from tests.support.systemd import SystemdManager
from tests.support.wait import wait_for
from tests.test_events_support import ECHO
from tests.test_registry_support import SLEEPER, open_registry
from tests.test_registry_support import request as make_request

ALICE = Owner(kind="client", id="alice")
BOB = Owner(kind="client", id="bob")
TTL = 3600.0
KEEP = 3


@dataclass(frozen=True)
class Subject:
    """A registry under test, and how the test drives sessions to their end."""

    registry: Registry
    finish: Callable[[int, bytes], Session]
    """Spawn a session that ends with (exit code, output); return it finished."""
    end: Callable[[Session], Session]
    """End a running :data:`ECHO` session with exit 0 and output ``bye``."""
    now: Callable[[], float]
    """The wall time the registry stamps ``finished_at`` with."""
    say: Callable[[Session, bytes], None]
    """Make a running :data:`ECHO` session write these lines."""
    placement: Placement
    """Where a default CLI spawn is placed."""


def _fake() -> Subject:
    clock = FakeClock(start=time.time())
    fake = FakeRegistry(clock=clock, settings=RegistrySettings(finished_ttl=TTL, max_sessions=KEEP))

    def finish(code: int, output: bytes) -> Session:
        clock.advance(1.0)  # distinct finishing times, as real sessions have
        session = fake.spawn(make_request(["worker"]))
        return fake.finish(session.id, exit_code=code, output=output)

    def end(session: Session) -> Session:
        return fake.finish(session.id, exit_code=0, output=b"bye\n")

    def say(session: Session, lines: bytes) -> None:
        fake.write(session.id, lines)

    return Subject(fake, finish, end, clock.time, say, Placement.IN_PROCESS)


@contextlib.contextmanager
def _process(state_dir: Path, scoper: Scoper | None, placement: Placement) -> Iterator[Subject]:
    with open_registry(state_dir, scoper, finished_ttl=TTL, max_sessions=KEEP) as real:

        def finish(code: int, output: bytes) -> Session:
            escaped = "".join(f"\\{b:03o}" for b in output)
            session = real.spawn(make_request(["sh", "-c", f"printf '{escaped}'; exit {code}"]))
            return real.wait(session.id, timeout=15).snapshot.session

        def end(session: Session) -> Session:
            real.write_stdin(session.id, b"bye\nquit\n")
            return real.wait(session.id, timeout=15).snapshot.session

        def say(session: Session, lines: bytes) -> None:
            real.write_stdin(session.id, lines)  # ECHO writes them back

        yield Subject(real, finish, end, time.time, say, placement)


@pytest.fixture(
    params=[
        "fake",
        "process",
        "process-forked",
        pytest.param("systemd", marks=pytest.mark.systemd),
        pytest.param("systemd-forked", marks=pytest.mark.systemd),
    ],
)
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    if request.param == "fake":
        yield _fake()
        return
    path = "fork_server" if request.param.endswith("-forked") else "direct"
    with start_path(path):
        yield from _real(request, tmp_path)


def _real(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    """The process registry, its keepers started on the start path now in force."""
    if request.param.startswith("process"):
        with _process(tmp_path / "state", None, Placement.IN_PROCESS) as found:
            yield found
    else:
        manager: SystemdManager = request.getfixturevalue("systemd_manager")
        scoper = open_scoper(ScopeSettings(), Policy(), environ=manager.env)
        try:
            with _process(tmp_path / "state", scoper, Placement.SCOPED) as found:
                yield found
        finally:
            scoper.close()


# -- sessions ----------------------------------------------------------------------------------


def test_finished_session_fields(subject: Subject) -> None:
    registry = subject.registry
    session = subject.finish(3, b"hello\n")
    assert session.state is SessionState.EXITED
    assert session.placement is subject.placement
    assert session.exit_code == 3 and session.signal is None
    assert session.finished_at is not None
    assert session.completion_reason == "exited with code 3"
    assert registry.poll(session.id).output == "hello\n"
    assert registry.read_log(session.id) == b"hello\n"
    assert registry.read_log(session.id, head=2) == b"he"
    assert registry.get(session.id) == session


def test_a_session_records_the_class_its_scope_got(subject: Subject) -> None:
    registry = subject.registry
    props = ScopeProperties(memory_max=256 << 20, runtime_max=600.0)
    session = registry.spawn(make_request(ECHO, resources=props))
    try:
        stored = registry.get(session.id)
        if subject.placement is Placement.SCOPED:
            assert stored.resources is not None
            assert stored.resources.limits == {"memory_max": 256 << 20, "runtime_max": 600.0}
            assert stored.resources.describe() == "memory_max 256MiB, runtime_max 600s"
        else:
            # No scope of its own: no class applies (docs/resources.md).
            assert stored.resources is None
    finally:
        subject.end(session)


def test_lookup(subject: Subject) -> None:
    registry = subject.registry
    session = subject.finish(0, b"")
    assert registry.resolve(session.id[:8]).id == session.id
    assert registry.resolve(session.id[2:8]).id == session.id
    assert registry.resolve(f"  {session.id[:6].upper().replace('S_', 's_')} ").id == session.id
    assert registry.resolve(session.id[:4]).id == session.id  # 4 characters as typed
    with pytest.raises(NotFoundError):
        registry.get("s_ffffffffffff")
    with pytest.raises(IdTooShort) as short:
        registry.resolve(session.id[:3])
    assert short.value.exit_code == 2 and "at least 4 characters" in short.value.message
    with pytest.raises(NotFoundError, match="look like s_"):
        registry.resolve("nosuch")
    with pytest.raises(NotFoundError):
        registry.resolve("s_ffffffffffff" if not session.id.startswith("s_ffff") else "s_0000")


def test_an_ambiguous_prefix_lists_every_candidate(
    subject: Subject, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = iter(["s_abcd00000001", "s_abcd00000002"])
    monkeypatch.setattr(IdKind, "new", lambda kind: next(made))
    twins = [subject.finish(0, b"").id for _ in range(2)]
    assert twins == ["s_abcd00000001", "s_abcd00000002"]
    with pytest.raises(AmbiguousId) as caught:
        subject.registry.resolve("abcd")
    assert caught.value.fields["candidates"] == twins
    assert caught.value.exit_code == 2 and isinstance(caught.value, UsageError)
    assert subject.registry.resolve("s_abcd00000002").id == twins[1]


def test_find_by_owner(subject: Subject) -> None:
    registry = subject.registry
    assert registry.find(ALICE) is None
    first = registry.spawn(make_request(ECHO, owner=ALICE))
    assert registry.find(ALICE) == registry.get(first.id)
    subject.end(first)
    found = registry.find(ALICE)
    assert found is not None and found.id == first.id and found.finished
    second = registry.spawn(make_request(ECHO, owner=ALICE))
    newest = registry.find(ALICE)
    assert newest is not None and newest.id == second.id  # the newest session of the owner
    registry.handoff(second.id, BOB, note="yours now")
    handed = registry.find(BOB)
    assert handed is not None and handed.id == second.id
    subject.end(second)
    assert registry.find(Owner(kind="client", id="nobody")) is None


def test_running_kill_wait_and_listeners(subject: Subject) -> None:
    registry = subject.registry
    seen: list[str] = []
    registry.add_finish_listener(lambda s: seen.append(s.id))
    session = registry.spawn(make_request(SLEEPER))
    assert session.placement is subject.placement
    assert [s.id for s in registry.list_sessions()] == [session.id]
    assert registry.wait(session.id, timeout=0.05).outcome is WaitOutcome.TIMEOUT
    stop = threading.Event()
    stop.set()
    assert registry.wait(session.id, interrupt=stop).outcome is WaitOutcome.INTERRUPTED
    snap = registry.kill(session.id, reason="test kill")
    assert snap.session.state is SessionState.KILLED
    assert snap.session.signal is not None
    assert registry.list_sessions() == []
    assert [s.id for s in registry.list_sessions(include_finished=True)] == [session.id]
    again = registry.kill(session.id)
    assert again.session == snap.session
    assert registry.wait(session.id, timeout=1).outcome is WaitOutcome.FINISHED
    assert seen == [session.id]


# -- output ------------------------------------------------------------------------------------

LOG = b"a\nb\npassword=hunter2\nd"


def test_reading_a_log_selects_then_presents(subject: Subject) -> None:
    registry = subject.registry
    session = subject.finish(0, LOG)
    sid = session.id
    assert registry.log_size(sid) == len(LOG)
    assert registry.read_log(sid) == LOG  # raw: byte for byte
    assert registry.read_log(sid, head=3) == b"a\nb"
    assert registry.read_log(sid, tail_lines=2) == b"password=hunter2\nd"
    assert registry.read_log(sid, tail_lines=0) == b""
    assert registry.read_log(sid, byte_range=(2, 5)) == b"b\np"
    assert registry.read_log(sid, byte_range=(0, 4), tail_lines=1) == b"b\n"
    assert registry.read_log(sid, tail_lines=2, hooks=True) == b"password=***\nd"
    assert registry.apply_hooks(session, "password=hunter2", purpose="logs") == "password=***"
    times = registry.output_times(sid)
    assert times.known and times.offset_since(0.0) == 0
    arrived = times.time_at(0)
    assert arrived is not None and arrived <= subject.now() + 1.0
    assert registry.read_log(sid, since=0.0) == LOG
    assert registry.read_log(sid, since=subject.now() + 3600) == b""
    assert registry.read_log(sid, stamp=lambda t: "T", tail_lines=2) == b"T password=hunter2\nT d"
    both = registry.read_log(sid, stamp=lambda t: "T", hooks=True, since=0.0)
    assert both == b"T a\nT b\nT password=***\nT d"


def test_a_tail_is_masked_before_it_is_cut(subject: Subject) -> None:
    registry = subject.registry
    session = subject.finish(3, b"x" * 3000 + b"\npassword=hunter2\nlast\n")
    whole = registry.tail(session.id, 100, purpose="notify")
    assert whole.output.endswith("\npassword=***\nlast\n") and whole.session.exit_code == 3
    assert whole.output_cut == 3019 - 100  # 3000 + 19 characters once masked
    # A cut through the secret shows none of it: the hooks saw the whole line first.
    cut = registry.tail(session.id, 10, purpose="notify")
    assert (cut.output, cut.output_cut) == ("=***\nlast\n", 3019 - 10)
    assert registry.tail(session.id, 0, purpose="notify").output == ""


def test_following_a_log_until_its_session_ends(subject: Subject) -> None:
    registry = subject.registry
    session = _spawn(registry)
    raw = registry.follow_log(session.id)
    hooked = registry.follow_log(session.id, hooks=True)
    subject.say(session, b"password=hunter2\n")
    first = next(raw)  # waits for the output
    assert first and b"password=hunter2\n".startswith(first)
    assert raw.session is None  # still running
    subject.end(session)
    assert first + b"".join(raw) == b"password=hunter2\nbye\n"
    assert raw.session is not None and raw.session.state is SessionState.EXITED
    assert b"".join(hooked) == b"password=***\nbye\n"  # hooked whole lines
    assert hooked.session == raw.session
    assert b"".join(registry.follow_log(session.id, 9)) == b"hunter2\nbye\n"  # from an offset


def test_a_follow_that_times_out_leaves_the_worker_running(subject: Subject) -> None:
    registry = subject.registry
    session = _spawn(registry)
    follow = registry.follow_log(session.id, timeout=0.2)
    assert b"".join(follow) == b"" and follow.session is None
    assert registry.get(session.id).state is SessionState.RUNNING
    polled = registry.follow_log(session.id)
    assert polled.read_new() == b"" and polled.offset == 0  # never waits
    subject.say(session, b"late\n")
    seen = bytearray()
    wait_for(lambda: seen.extend(polled.read_new()) or bytes(seen) == b"late\n", 10, what="line")
    assert polled.offset == 5
    subject.end(session)


# -- pruning -----------------------------------------------------------------------------------


def test_prune_removes_finished_sessions_past_the_ttl(subject: Subject) -> None:
    registry = subject.registry
    done = subject.finish(0, b"old\n")
    running = registry.spawn(make_request(SLEEPER))
    now = subject.now()
    assert registry.prune(now=now) == 0
    assert registry.get(done.id) == done
    assert registry.prune(now=now + TTL + 10) == 1
    with pytest.raises(NotFoundError):
        registry.get(done.id)
    assert [s.id for s in registry.list_sessions(include_finished=True)] == [running.id]
    registry.kill(running.id)


def test_prune_keeps_only_the_newest_finished_sessions(subject: Subject) -> None:
    registry = subject.registry
    ids = [subject.finish(0, b"").id for _ in range(KEEP + 2)]
    assert registry.prune(now=subject.now()) == 2
    left = {s.id for s in registry.list_sessions(include_finished=True)}
    assert left == set(ids[2:])
    assert registry.prune(now=subject.now()) == 0


# -- events and ownership ----------------------------------------------------------------------


def _spawn(registry: Registry, **fields: Any) -> Session:
    request: SpawnRequest = make_request(ECHO, **fields)
    return registry.spawn(request)


def test_notifying_session_publishes_exactly_one_completion(subject: Subject) -> None:
    registry = subject.registry
    seen: list[Event] = []
    registry.add_event_listener(seen.append)
    quiet = _spawn(registry, owner=ALICE)
    loud = _spawn(registry, owner=ALICE, notify=True)
    assert loud.notify and not quiet.notify
    subject.end(quiet)
    done = subject.end(loud)
    (event,) = registry.events(owner=ALICE)
    assert [e.id for e in seen] == [event.id]
    assert event.type is EventType.COMPLETION and event.session_id == loud.id
    assert event.seq == 1 and event.owner == ALICE
    assert (event.state, event.exit_code, event.signal) == (SessionState.EXITED, 0, None)
    assert event.completion_reason == done.completion_reason
    assert event.output == "bye\n" and event.output_cut == 0
    assert registry.pending_completions() == 0
    first = registry.ack([event.id])
    assert first.acked == (event.id,)
    assert registry.ack([event.id]).already == (event.id,)
    assert registry.events() == []
    assert [e.id for e in registry.events(include_acked=True)] == [event.id]


def test_handoff_and_teardown(subject: Subject) -> None:
    registry = subject.registry
    handed = _spawn(registry, owner=ALICE, notify=True)
    kept = _spawn(registry, owner=ALICE, notify=True)
    moved = registry.handoff(handed.id, BOB, note="please finish")
    assert moved.owner == BOB and moved.handoff_note == "please finish"
    with pytest.raises(HandoffRefused):
        registry.handoff(handed.id, BOB, note="again")  # already BOB's
    report = registry.teardown_owner(ALICE, grace=0.3)
    assert [s.session.id for s in report.orphaned] == [kept.id]
    assert report.orphaned[0].session.state is SessionState.KILLED
    assert [e.session_id for e in report.unread] == [kept.id]
    assert registry.events(owner=ALICE) == []
    assert registry.get(handed.id).state is SessionState.RUNNING  # not Alice's any more
    subject.end(handed)
    kinds = [(e.type, e.note) for e in registry.events(owner=BOB)]
    assert kinds == [
        (EventType.HANDOFF, "please finish"),
        (EventType.COMPLETION, "please finish"),
    ]


def test_pruning_keeps_unread_events_and_forgets_handoffs(subject: Subject) -> None:
    registry = subject.registry
    handed = _spawn(registry, owner=ALICE, notify=True)
    registry.handoff(handed.id, BOB, note="yours")
    subject.end(handed)
    unread = [e.id for e in registry.events(owner=BOB)]
    assert len(unread) == 2
    assert registry.prune(now=subject.now() + TTL + 10) == 1
    assert [e.id for e in registry.events(owner=BOB)] == unread  # still to be read
    registry.ack(unread)
    # The pruned session's handoff no longer counts against Alice's limit.
    for _ in range(3):
        other = _spawn(registry, owner=ALICE)
        registry.handoff(other.id, BOB, note="more")
    with pytest.raises(HandoffRefused):
        registry.handoff(_spawn(registry, owner=ALICE).id, BOB, note="one too many")
    for session in registry.list_sessions():
        registry.kill(session.id, grace=0.3)
