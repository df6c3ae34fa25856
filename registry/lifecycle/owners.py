"""The owner desk: what an owner asks of the registry about its sessions.

Reading and acknowledging its events, counting completions not published yet, handing a
running session to another owner, and an owner's teardown. The events themselves are stored
by :mod:`registry.store.events` (in the transactions of :mod:`registry.store.sessions`); this
part checks the requests and routes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from registry.abc import (
    MAX_HANDOFFS,
    AckResult,
    Event,
    EventType,
    Owner,
    Session,
    SessionState,
    Snapshot,
    TeardownReport,
)
from registry.errors import HandoffRefused, RegistryError
from registry.keeper.files import SessionDir
from registry.lifecycle.parts import Parts
from registry.lifecycle.reconcile import Reconciler
from registry.store.events import EventDraft
from registry.store.sessions import HandoffResult
from scope.foundation.errors import UsageError

__all__ = ["MAX_NOTE_CHARS", "OwnerDesk", "check_handoff", "handoff_note", "owned_by"]

MAX_NOTE_CHARS = 2000
"""The longest handoff purpose note."""

Killer = Callable[..., Snapshot]
"""``kill(session_id, *, grace, reason)`` of the registry (teardown kills through it)."""


def owned_by(owner: Owner, wanted: Owner | str) -> bool:
    """Whether ``owner`` is routed to ``wanted`` (exact, or a ``:``-bounded string prefix)."""
    if isinstance(wanted, Owner):
        return owner == wanted
    text = str(owner)
    return text == wanted or text.startswith(wanted + ":")


class OwnerDesk:
    """Events, acknowledgements, handoffs and teardowns (see :class:`registry.abc.Registry`)."""

    def __init__(self, parts: Parts, reconciler: Reconciler, kill: Killer) -> None:
        self.parts = parts
        self.reconciler = reconciler
        self.kill = kill

    def events(
        self,
        *,
        owner: Owner | str | None = None,
        include_acked: bool = False,
        session_id: str | None = None,
        after: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Stored events, oldest first."""
        return self.parts.store.events.list(
            owner=owner,
            include_acked=include_acked,
            session_id=session_id,
            after=after,
            limit=limit,
        )

    def ack(self, event_ids: Iterable[str]) -> AckResult:
        """Acknowledge events by id (idempotent)."""
        return self.parts.store.events.ack(event_ids, now=self.parts.clock.time())

    def pending_completions(self, owner: Owner | str | None = None) -> int:
        """Sessions that ended whose completion is not published yet."""
        count = 0
        self.reconciler.reap_children()
        for stored in self.parts.store.running_notifying():
            if owner is not None and not owned_by(stored.session.owner, owner):
                continue
            if not self.parts.tracking.followed(stored.session.id):
                # Nobody here follows it: reconcile now (a recorded end is published at once).
                stored = self.reconciler.refresh(stored, reap=False)
                if stored.session.finished:
                    continue
            if SessionDir(Path(stored.dir)).has_exit():
                count += 1
        return count

    def handoff(self, session_id: str, to: Owner, *, note: str, by: Owner | None = None) -> Session:
        """Give a running session to another owner with a purpose note."""
        parts = self.parts
        text = handoff_note(note)
        session = self.reconciler.refresh(parts.load(session_id)).session
        check_handoff(session, to, by)
        current = session.owner
        draft = EventDraft(
            type=EventType.HANDOFF,
            state=SessionState.RUNNING,
            note=text,
            log_path=session.log_path,
            data={"from": str(current), "to": str(to)},
        )
        result, event = parts.store.handoff(
            session.id,
            current=current,
            to=to,
            note=text,
            now=parts.clock.time(),
            limit=MAX_HANDOFFS,
            draft=draft,
        )
        if result is HandoffResult.LIMIT:
            raise HandoffRefused(
                f"owner {current} already handed off {MAX_HANDOFFS} sessions",
                session=session.id,
                remedy="let the new owner's own work continue it, or wait for it to finish",
            )
        if result is not HandoffResult.OK:
            raise HandoffRefused(
                "it finished or changed owner while handing it off", session=session.id
            )
        parts.notifier.emit(event)
        return self.reconciler.refresh(parts.load(session.id)).session

    def teardown_owner(
        self, owner: Owner, *, reason: str | None = None, grace: float | None = None
    ) -> TeardownReport:
        """An owner's explicit end: kill what it still owns, collect what it never read."""
        parts = self.parts
        why = reason or f"owner {owner} tore down"
        orphaned: list[Snapshot] = []
        errors: list[str] = []
        for stored in parts.store.owned_running(owner):
            session = self.reconciler.refresh(stored).session
            if session.finished:
                continue
            notice = EventDraft(
                type=EventType.ORPHANED,
                state=SessionState.RUNNING,
                log_path=session.log_path,
                note=session.handoff_note,
                data={"reason": why},
            )
            parts.notifier.emit(parts.store.publish(session.id, notice, now=parts.clock.time()))
            try:
                orphaned.append(self.kill(session.id, grace=grace, reason=f"orphaned: {why}"))
            except RegistryError as err:
                errors.append(f"{session.id}: {err}")
        pending = self.events(owner=owner)
        unread = tuple(e for e in pending if e.type is EventType.COMPLETION)
        # The owner is gone: its report carries what it never read, nobody else will.
        self.ack(e.id for e in pending)
        return TeardownReport(
            owner=owner, orphaned=tuple(orphaned), unread=unread, errors=tuple(errors)
        )


def check_handoff(session: Session, to: Owner, by: Owner | None) -> None:
    """Refuse a handoff of a finished session, one asked for by someone other than its owner,
    or one to its current owner (:class:`HandoffRefused`)."""
    if session.finished:
        raise HandoffRefused(f"it is {session.state.value}", session=session.id)
    current = session.owner
    if by is not None and by != current:
        raise HandoffRefused(f"it is owned by {current}, not {by}", session=session.id)
    if to == current:
        raise HandoffRefused(f"it is already owned by {to}", session=session.id)


def handoff_note(note: str) -> str:
    """The purpose note of a handoff, stripped (UsageError when empty or too long)."""
    text = note.strip()
    if not text:
        raise UsageError("a handoff needs a purpose note", remedy="say why the new owner gets it")
    if len(text) > MAX_NOTE_CHARS:
        raise UsageError(f"the handoff note is longer than {MAX_NOTE_CHARS} characters")
    return text
