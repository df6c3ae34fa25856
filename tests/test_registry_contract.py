"""One contract suite for every Registry: the in-memory fake and the real process registry."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from registry.abc import Registry, Session, SessionState, SpawnRequest, WaitOutcome
from registry.errors import AmbiguousId
from registry.fake import FakeRegistry
from scope.foundation.errors import NotFoundError, UsageError
from tests.test_registry_support import SLEEPER, open_registry
from tests.test_registry_support import request as make_request

Finisher = Callable[[int, bytes], Session]


@pytest.fixture(params=["fake", "process"])
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Registry, Finisher]]:
    """A registry plus a way to make a session that ends with (code, output)."""
    if request.param == "fake":
        fake = FakeRegistry()

        def finish_fake(code: int, output: bytes) -> Session:
            session = fake.spawn(_req(["worker"]))
            return fake.finish(session.id, exit_code=code, output=output)

        yield fake, finish_fake
        return
    with open_registry(tmp_path / "state") as real:

        def finish_real(code: int, output: bytes) -> Session:
            escaped = "".join(f"\\{b:03o}" for b in output)
            session = real.spawn(_req(["sh", "-c", f"printf '{escaped}'; exit {code}"]))
            return real.wait(session.id, timeout=10).snapshot.session

        yield real, finish_real


def _req(argv: list[str]) -> SpawnRequest:
    return make_request(argv)


def test_finished_session_fields(subject: tuple[Registry, Finisher]) -> None:
    registry, finish = subject
    session = finish(3, b"hello\n")
    assert session.state is SessionState.EXITED
    assert session.exit_code == 3 and session.signal is None
    assert session.finished_at is not None
    assert session.completion_reason == "exited with code 3"
    assert registry.poll(session.id).output == "hello\n"
    assert registry.read_log(session.id) == b"hello\n"
    assert registry.read_log(session.id, head=2) == b"he"
    assert registry.get(session.id) == session


def test_lookup(subject: tuple[Registry, Finisher]) -> None:
    registry, finish = subject
    session = finish(0, b"")
    assert registry.resolve(session.id[:8]).id == session.id
    assert registry.resolve(session.id[2:8]).id == session.id
    with pytest.raises(NotFoundError):
        registry.get("s_ffffffffffff")
    with pytest.raises((NotFoundError, UsageError)):
        registry.resolve("s_ab")
    with pytest.raises(NotFoundError):
        registry.resolve("s_ffffffffffff")
    assert isinstance(AmbiguousId("session", "abcd", ["a", "b"]), UsageError)


def test_running_kill_wait_and_listeners(subject: tuple[Registry, Finisher]) -> None:
    registry, _ = subject
    seen: list[str] = []
    registry.add_finish_listener(lambda s: seen.append(s.id))
    session = registry.spawn(_req(SLEEPER))
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
