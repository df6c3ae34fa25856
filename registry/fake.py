"""An in-memory :class:`~registry.abc.Registry`: nothing runs, tests decide how sessions end.

For unit tests of callers (cron, kanban, users' own code). Sessions start ``running``; a test
ends them with :meth:`FakeRegistry.finish` and listeners fire as with the real registry. Spawn
placement comes from an optional :class:`~scope.abc.Scoper` (so refusals and degrades follow
the real placement table) or defaults to ``in_process``.

Output lives in memory (:attr:`FakeRegistry.outputs`, with the arrival times that
:meth:`FakeRegistry.write` and ``finish`` note) and is read, followed and presented by the
same code as the real registry's log (:mod:`registry.output.log`); output handed out passes
the same hooks as in the real registry (redaction on by default).

Events follow the contract in memory: a notifying session's :meth:`FakeRegistry.finish`
publishes one completion event (ids, per-session sequence numbers, acknowledgement, routing,
handoffs, teardown); :meth:`FakeRegistry.publish` lets a test add heartbeat or watch events.
"""

from __future__ import annotations

import signal as signals
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from registry.abc import (
    MAX_HANDOFFS,
    SESSION_IDS,
    AckResult,
    Event,
    EventListener,
    EventType,
    FinishListener,
    LogFollow,
    OutputTimes,
    Owner,
    Registry,
    Session,
    SessionState,
    Snapshot,
    SpawnRequest,
    Stamp,
    TeardownReport,
    WaitOutcome,
    WaitResult,
)
from registry.errors import HandoffRefused, RegistryError
from registry.lifecycle.owners import check_handoff, handoff_note, owned_by
from registry.live.heartbeat import clamp_interval
from registry.live.watch import parse_patterns
from registry.output.hooks import OutputHooks
from registry.output.log import ArrivalTimes, BufferLog, Following, Presenter
from registry.output.log import read as read_of
from registry.output.redact import Redactor
from registry.settings import RegistrySettings
from registry.store.events import new_event_id
from registry.store.retention import due_for_pruning
from registry.usage import ResourceClass
from scope.abc import Placement, ScopeProperties, Scoper
from scope.foundation.clock import Clock, SystemClock
from scope.foundation.errors import NotFoundError
from scope.foundation.ids import MAX_CANDIDATES, lookup

DEFAULT_OUTPUT_CHARS = 2000


FAKE_PID_BASE = 10_000_000


class FakeRegistry(Registry):
    """Sessions in a dict; outputs in memory; ``finish`` ends them."""

    def __init__(
        self,
        scoper: Scoper | None = None,
        clock: Clock | None = None,
        hooks: OutputHooks | None = None,
        output_chars: int = DEFAULT_OUTPUT_CHARS,
        settings: RegistrySettings | None = None,
    ) -> None:
        self.scoper = scoper
        self.clock: Clock = clock or SystemClock()
        self.settings = settings or RegistrySettings()
        """Only ``finished_ttl`` and ``max_sessions`` (pruning) are used."""
        self.hooks = hooks if hooks is not None else OutputHooks(redactor=Redactor())
        self.output_chars = output_chars
        self.event_log: list[Event] = []
        """Every stored event, oldest first (acknowledged ones too)."""
        self._event_seq: dict[str, int] = {}
        self._handoffs: list[tuple[str, str]] = []
        """(session id, the owner that handed it off), as the real store's handoff rows."""
        self._event_listeners: list[EventListener] = []
        self.sessions: dict[str, Session] = {}
        self._by_owner: dict[Owner, str] = {}
        """The newest session of each owner (the real store's owner index)."""
        self.outputs: dict[str, bytearray] = {}
        self.times: dict[str, ArrivalTimes] = {}
        """When each session's output arrived (noted by :meth:`write` and :meth:`finish`)."""
        self.stdin: dict[str, bytearray] = {}
        self.requests: dict[str, SpawnRequest] = {}
        self.spawn_errors: list[BaseException] = []
        """Exceptions the next spawns raise, in order (then spawns succeed again)."""
        self.failed_start_argv0: set[str] = set()
        """argv[0] values that become ``failed_start`` sessions."""
        self._listeners: list[FinishListener] = []
        self._cond = threading.Condition()

    # -- test controls ----------------------------------------------------------------------

    def finish(
        self,
        session_id: str,
        *,
        exit_code: int | None = 0,
        signal: str | None = None,
        output: bytes = b"",
        state: SessionState = SessionState.EXITED,
        reason: str | None = None,
    ) -> Session:
        """End a running session as if its worker exited (or died of ``signal``)."""
        with self._cond:
            session = self.get(session_id)
            if session.finished:
                return session
            self._append(session_id, output)
            if reason is None:
                reason = f"killed by {signal}" if signal else f"exited with code {exit_code}"
            done = replace(
                session,
                state=state,
                exit_code=None if signal else exit_code,
                signal=signal,
                finished_at=self.clock.time(),
                completion_reason=reason,
                total_bytes=len(self.outputs[session_id]),
            )
            self.sessions[session_id] = done
            self._cond.notify_all()
            event = None
            if done.notify:
                view, cut = self._tail(session_id)
                code = done.exit_code
                event = self._store_event(
                    done,
                    EventType.COMPLETION,
                    output=self._handed(view, done, code, "completion"),
                    output_cut=cut,
                    data={"total_bytes": done.total_bytes},
                )
        self._emit(event)
        self._notify(done)
        return done

    def write(self, session_id: str, data: bytes) -> None:
        """Test control: a running session's worker writes ``data`` (noted at the clock's time)."""
        with self._cond:
            if self.get(session_id).finished:
                raise RegistryError(f"session {session_id} is finished", session=session_id)
            self._append(session_id, data)
            self._cond.notify_all()

    def _append(self, session_id: str, data: bytes) -> None:
        if data:
            self.times[session_id].note(len(self.outputs[session_id]), self.clock.time())
            self.outputs[session_id] += data

    def publish(
        self,
        session_id: str,
        type: EventType,
        *,
        output: str = "",
        output_cut: int = 0,
        data: Mapping[str, Any] | None = None,
    ) -> Event:
        """Test control: store an event (a heartbeat, a watch match ...) for a session."""
        with self._cond:
            session = self.get(session_id)
            event = self._store_event(
                session,
                EventType(type),
                output=self._handed(output, session, session.exit_code, EventType(type).value),
                output_cut=output_cut,
                data=dict(data or {}),
            )
        self._emit(event)
        return event

    def _store_event(
        self,
        session: Session,
        type: EventType,
        *,
        output: str = "",
        output_cut: int = 0,
        note: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> Event:
        seq = self._event_seq.get(session.id, 0) + 1
        self._event_seq[session.id] = seq
        final = type is EventType.COMPLETION
        event = Event(
            id=new_event_id(),
            seq=seq,
            type=type,
            session_id=session.id,
            owner=session.owner,
            created_at=self.clock.time(),
            position=len(self.event_log) + 1,
            state=session.state,
            exit_code=session.exit_code if final else None,
            signal=session.signal if final else None,
            completion_reason=session.completion_reason if final else None,
            output=output,
            output_cut=output_cut,
            log_path=session.log_path,
            note=note if note is not None else session.handoff_note,
            data=dict(data or {}),
        )
        self.event_log.append(event)
        return event

    def running(self) -> list[Session]:
        """Sessions still running."""
        return [s for s in self.sessions.values() if not s.finished]

    # -- Registry ----------------------------------------------------------------------------

    def spawn(self, request: SpawnRequest) -> Session:
        if self.spawn_errors:
            raise self.spawn_errors.pop(0)
        placement, unit, warning = Placement.IN_PROCESS, None, None
        if self.scoper is not None:
            decision = self.scoper.decide(request.caller, wants_isolation=request.wants_isolation)
            placement = decision.placement
            if decision.warn:
                warning = f"{decision.cause}; {decision.remedy}"
        sid = SESSION_IDS.new()
        if placement is Placement.SCOPED:
            unit = "-".join(("dispatch", request.caller.value, *request.unit_parts, sid)) + ".scope"
        argv = (request.argv,) if isinstance(request.argv, str) else tuple(request.argv)
        watch = parse_patterns(request.watch)
        heartbeat = None if request.heartbeat is None else clamp_interval(request.heartbeat)
        now = self.clock.time()
        failed = argv[0] in self.failed_start_argv0
        session = Session(
            id=sid,
            argv=argv,
            cwd=request.cwd,
            owner=request.owner,
            caller=request.caller,
            placement=placement,
            unit=unit,
            state=SessionState.FAILED_START if failed else SessionState.RUNNING,
            log_path=f"memory://{sid}",
            pty=request.pty,
            started_at=now,
            finished_at=now if failed else None,
            completion_reason=f"No such file or directory: {argv[0]!r}" if failed else None,
            timeout=request.timeout,
            labels=dict(request.labels),
            # Synthetic, beyond any real pid_max (2**22): nothing here is ever signalled.
            keeper_pid=FAKE_PID_BASE + len(self.sessions),
            warning=warning,
            notify=request.notify or heartbeat is not None,
            heartbeat=heartbeat,
            watch=watch,
            resources=ResourceClass.of(request.resources or ScopeProperties())
            if placement is Placement.SCOPED
            else None,
        )
        with self._cond:
            self.sessions[sid] = session
            self._by_owner[request.owner] = sid
            self.outputs[sid] = bytearray()
            self.times[sid] = ArrivalTimes()
            self.stdin[sid] = bytearray()
            self.requests[sid] = request
        if failed:
            event = None
            if session.notify:
                with self._cond:
                    event = self._store_event(session, EventType.COMPLETION)
            self._emit(event)
            self._notify(session)
        return session

    def get(self, session_id: str) -> Session:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise NotFoundError("session", session_id) from None

    def resolve(self, prefix: str) -> Session:
        return self.get(lookup(prefix, SESSION_IDS, starting=self._ids_starting))

    def _ids_starting(self, prefix: str) -> list[str]:
        with self._cond:
            return sorted(sid for sid in self.sessions if sid.startswith(prefix))[:MAX_CANDIDATES]

    def list_sessions(self, *, include_finished: bool = False) -> list[Session]:
        found = [s for s in self.sessions.values() if include_finished or not s.finished]
        return sorted(found, key=lambda s: s.started_at or 0, reverse=True)

    def find(self, owner: Owner) -> Session | None:
        with self._cond:
            sid = self._by_owner.get(owner)
            return None if sid is None else self.sessions.get(sid)

    def poll(self, session_id: str) -> Snapshot:
        return self._snapshot(session_id, "poll")

    def _snapshot(self, session_id: str, purpose: str) -> Snapshot:
        session = self.get(session_id)
        text, cut = self._tail(session_id)
        return Snapshot(
            session=session,
            output=self._handed(text, session, session.exit_code, purpose),
            output_cut=cut,
        )

    def _tail(self, session_id: str) -> tuple[str, int]:
        request = self.requests.get(session_id)
        chars = self.output_chars
        if request is not None and request.output_chars is not None:
            chars = request.output_chars
        text = bytes(self.outputs[session_id]).decode("utf-8", "replace")
        shown = text[-chars:] if chars > 0 else ""
        return shown, len(text) - len(shown)

    def _handed(self, text: str, session: Session, exit_code: int | None, purpose: str) -> str:
        return self.hooks.apply(
            text, session_id=session.id, owner=session.owner, exit_code=exit_code, purpose=purpose
        )

    def wait(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
        interrupt: threading.Event | Callable[[], bool] | None = None,
    ) -> WaitResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self.get(session_id).finished:
                if interrupt is not None and (
                    interrupt.is_set() if isinstance(interrupt, threading.Event) else interrupt()
                ):
                    return WaitResult(
                        outcome=WaitOutcome.INTERRUPTED, snapshot=self._snapshot(session_id, "wait")
                    )
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return WaitResult(
                        outcome=WaitOutcome.TIMEOUT, snapshot=self._snapshot(session_id, "wait")
                    )
                self._cond.wait(0.05 if remaining is None else min(0.05, remaining))
        return WaitResult(outcome=WaitOutcome.FINISHED, snapshot=self._snapshot(session_id, "wait"))

    def read_log(
        self,
        session_id: str,
        *,
        head: int | None = None,
        tail_lines: int | None = None,
        byte_range: tuple[int, int] | None = None,
        since: float | None = None,
        stamp: Stamp | None = None,
        hooks: bool = False,
    ) -> bytes:
        session = self.get(session_id)
        return read_of(
            BufferLog(self.outputs[session_id]),
            lambda: self.times[session_id],
            head=head,
            tail_lines=tail_lines,
            byte_range=byte_range,
            since=since,
            stamp=stamp,
            hooks=self._logs_hooks(session) if hooks else None,
        )

    def log_size(self, session_id: str) -> int | None:
        self.get(session_id)
        return len(self.outputs[session_id])

    def follow_log(
        self,
        session_id: str,
        offset: int = 0,
        *,
        stamp: Stamp | None = None,
        hooks: bool = False,
        timeout: float | None = None,
    ) -> LogFollow:
        session = self.get(session_id)
        presenter = Presenter.asked(
            offset,
            times=lambda: self.times[session_id],
            stamp=stamp,
            hooks=self._logs_hooks(session) if hooks else None,
        )
        log = BufferLog(self.outputs[session_id])
        return Following(self, session_id, log, offset, presenter, timeout=timeout)

    def output_times(self, session_id: str) -> OutputTimes:
        self.get(session_id)
        return self.times[session_id]

    def apply_hooks(self, session: Session, text: str, *, purpose: str) -> str:
        return self._handed(text, session, session.exit_code, purpose)

    def tail(self, session_id: str, chars: int, *, purpose: str) -> Snapshot:
        session = self.get(session_id)
        # The whole output is in memory: the hooks see all of it, then it is cut.
        text = bytes(self.outputs[session_id]).decode("utf-8", "replace")
        handed = self._handed(text, session, session.exit_code, purpose)
        kept = handed[-chars:] if chars > 0 else ""
        return Snapshot(session=session, output=kept, output_cut=len(handed) - len(kept))

    def _logs_hooks(self, session: Session) -> Callable[[str], str]:
        return lambda text: self._handed(text, session, session.exit_code, "logs")

    def write_stdin(self, session_id: str, data: bytes) -> None:
        self.get(session_id)
        self.stdin[session_id] += data

    def kill(
        self,
        session_id: str,
        *,
        grace: float | None = None,
        state: SessionState = SessionState.KILLED,
        reason: str = "killed by request",
    ) -> Snapshot:
        session = self.get(session_id)
        if not session.finished:
            self.finish(
                session_id,
                exit_code=None,
                signal=signals.Signals.SIGTERM.name,
                state=state,
                reason=reason,
            )
        return self._snapshot(session_id, "kill")

    def adopt(self) -> list[Session]:
        return []

    def prune(self, *, now: float | None = None) -> int:
        when = self.clock.time() if now is None else now
        with self._cond:
            ids = set(
                due_for_pruning(
                    ((s.id, s.finished_at) for s in self.sessions.values() if s.finished),
                    finished_before=when - self.settings.finished_ttl,
                    keep=self.settings.max_sessions,
                )
            )
            for session_id in ids:
                for table in (self.sessions, self.outputs, self.times, self.stdin, self.requests):
                    table.pop(session_id, None)
            self._by_owner = {o: sid for o, sid in self._by_owner.items() if sid not in ids}
            # As in the real store: acknowledged events and handoffs go with the session;
            # unacknowledged events stay until acknowledged.
            self.event_log = [e for e in self.event_log if not (e.session_id in ids and e.acked)]
            self._handoffs = [h for h in self._handoffs if h[0] not in ids]
        return len(ids)

    def add_finish_listener(self, listener: FinishListener) -> None:
        self._listeners.append(listener)

    # -- events and ownership ----------------------------------------------------------------

    def events(
        self,
        *,
        owner: Owner | str | None = None,
        include_acked: bool = False,
        session_id: str | None = None,
        after: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        with self._cond:
            found = [
                e
                for e in self.event_log
                if (include_acked or e.acked_at is None)
                and (session_id is None or e.session_id == session_id)
                and (after is None or e.position > after)
                and (owner is None or owned_by(e.owner, owner))
            ]
        return found if limit is None else found[: max(0, limit)]

    def ack(self, event_ids: Iterable[str]) -> AckResult:
        acked: list[str] = []
        already: list[str] = []
        unknown: list[str] = []
        with self._cond:
            index = {e.id: i for i, e in enumerate(self.event_log)}
            for event_id in dict.fromkeys(event_ids):
                where = index.get(event_id)
                if where is None:
                    unknown.append(event_id)
                elif self.event_log[where].acked_at is not None:
                    already.append(event_id)
                else:
                    self.event_log[where] = replace(
                        self.event_log[where], acked_at=self.clock.time()
                    )
                    acked.append(event_id)
        return AckResult(acked=tuple(acked), already=tuple(already), unknown=tuple(unknown))

    def pending_completions(self, owner: Owner | str | None = None) -> int:
        return 0  # finish() stores the final state and the completion together

    def handoff(self, session_id: str, to: Owner, *, note: str, by: Owner | None = None) -> Session:
        text = handoff_note(note)
        with self._cond:
            session = self.get(session_id)
            check_handoff(session, to, by)
            current = session.owner
            if sum(1 for _, by_owner in self._handoffs if by_owner == str(current)) >= MAX_HANDOFFS:
                raise HandoffRefused(
                    f"owner {current} already handed off {MAX_HANDOFFS} sessions",
                    session=session_id,
                )
            self._handoffs.append((session_id, str(current)))
            moved = replace(session, owner=to, handoff_note=text, handoff_from=current)
            self.sessions[session_id] = moved
            if self._by_owner.get(current) == session_id:
                del self._by_owner[current]
            self._by_owner[to] = session_id
            event = self._store_event(
                moved, EventType.HANDOFF, note=text, data={"from": str(current), "to": str(to)}
            )
        self._emit(event)
        return moved

    def teardown_owner(
        self, owner: Owner, *, reason: str | None = None, grace: float | None = None
    ) -> TeardownReport:
        why = reason or f"owner {owner} tore down"
        orphaned: list[Snapshot] = []
        errors: list[str] = []
        for session in [s for s in self.running() if s.owner == owner]:
            with self._cond:
                event = self._store_event(session, EventType.ORPHANED, data={"reason": why})
            self._emit(event)
            try:
                orphaned.append(self.kill(session.id, grace=grace, reason=f"orphaned: {why}"))
            except RegistryError as err:
                errors.append(f"{session.id}: {err}")
        pending = self.events(owner=owner)
        self.ack(e.id for e in pending)
        return TeardownReport(
            owner=owner,
            orphaned=tuple(orphaned),
            unread=tuple(e for e in pending if e.type is EventType.COMPLETION),
            errors=tuple(errors),
        )

    def add_event_listener(self, listener: EventListener) -> None:
        self._event_listeners.append(listener)

    def _emit(self, event: Event | None) -> None:
        if event is None:
            return
        for listener in list(self._event_listeners):
            listener(event)

    def _notify(self, session: Session) -> None:
        for listener in list(self._listeners):
            listener(session)


def owner(kind: str, ident: str) -> Owner:
    """Shorthand for tests: ``owner("kanban", "r1")``."""
    return Owner(kind=kind, id=ident)


__all__: Sequence[str] = ("FakeRegistry", "owner")
