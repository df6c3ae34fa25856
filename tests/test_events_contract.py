"""The event half of the registry contract, run against the fake and the real registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from registry.abc import EventType, Owner, Registry, Session, SessionState
from registry.errors import HandoffRefused
from registry.fake import FakeRegistry
from tests.test_events_support import ECHO, registry_at
from tests.test_registry_support import request as make_request

ALICE = Owner(kind="client", id="alice")
BOB = Owner(kind="client", id="bob")
Ender = Callable[[Session], Session]


@pytest.fixture(params=["fake", "process"])
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Registry, Ender]]:
    """A registry and a way to end one of its running ECHO sessions with exit 0."""
    if request.param == "fake":
        fake = FakeRegistry()
        yield fake, lambda s: fake.finish(s.id, exit_code=0, output=b"bye\n")
        return
    with registry_at(tmp_path / "state") as real:

        def end(session: Session) -> Session:
            real.write_stdin(session.id, b"bye\nquit\n")
            return real.wait(session.id, timeout=10).snapshot.session

        yield real, end


def test_notifying_session_publishes_exactly_one_completion(
    subject: tuple[Registry, Ender],
) -> None:
    registry, end = subject
    seen = []
    registry.add_event_listener(seen.append)
    quiet = registry.spawn(make_request(ECHO, owner=ALICE))
    loud = registry.spawn(make_request(ECHO, owner=ALICE, notify=True))
    assert loud.notify and not quiet.notify
    end(quiet)
    done = end(loud)
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


def test_handoff_and_teardown(subject: tuple[Registry, Ender]) -> None:
    registry, end = subject
    handed = registry.spawn(make_request(ECHO, owner=ALICE, notify=True))
    kept = registry.spawn(make_request(ECHO, owner=ALICE, notify=True))
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
    end(handed)
    kinds = [(e.type, e.note) for e in registry.events(owner=BOB)]
    assert kinds == [
        (EventType.HANDOFF, "please finish"),
        (EventType.COMPLETION, "please finish"),
    ]
