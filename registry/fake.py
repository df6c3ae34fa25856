"""An in-memory :class:`~registry.abc.Registry`: nothing runs, tests decide how sessions end.

For unit tests of callers (cron, kanban, users' own code). Sessions start ``running``; a test
ends them with :meth:`FakeRegistry.finish` and listeners fire as with the real registry. Spawn
placement comes from an optional :class:`~scope.abc.Scoper` (so refusals and degrades follow
the real placement table) or defaults to ``in_process``.
"""

from __future__ import annotations

import secrets
import signal as signals
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from registry.abc import (
    FinishListener,
    Owner,
    Registry,
    Session,
    SessionState,
    Snapshot,
    SpawnRequest,
    WaitOutcome,
    WaitResult,
)
from registry.errors import AmbiguousId
from scope.abc import Placement, Scoper
from scope.errors import NotFoundError


class FakeRegistry(Registry):
    """Sessions in a dict; outputs in memory; ``finish`` ends them."""

    def __init__(
        self,
        scoper: Scoper | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.scoper = scoper
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self.outputs: dict[str, bytearray] = {}
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
            self.outputs[session_id] += output
            if reason is None:
                reason = f"killed by {signal}" if signal else f"exited with code {exit_code}"
            done = replace(
                session,
                state=state,
                exit_code=None if signal else exit_code,
                signal=signal,
                finished_at=self.clock(),
                completion_reason=reason,
                total_bytes=len(self.outputs[session_id]),
            )
            self.sessions[session_id] = done
            self._cond.notify_all()
        self._notify(done)
        return done

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
        sid = "s_" + secrets.token_hex(6)
        if placement is Placement.SCOPED:
            unit = "-".join(("dispatch", request.caller.value, *request.unit_parts, sid)) + ".scope"
        argv = (request.argv,) if isinstance(request.argv, str) else tuple(request.argv)
        now = self.clock()
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
            warning=warning,
        )
        with self._cond:
            self.sessions[sid] = session
            self.outputs[sid] = bytearray()
            self.stdin[sid] = bytearray()
            self.requests[sid] = request
        if failed:
            self._notify(session)
        return session

    def get(self, session_id: str) -> Session:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise NotFoundError("session", session_id) from None

    def resolve(self, prefix: str) -> Session:
        if prefix in self.sessions:
            return self.sessions[prefix]
        wanted = prefix if prefix.startswith("s_") else "s_" + prefix
        matches = [sid for sid in self.sessions if sid.startswith(wanted)]
        if len(prefix.removeprefix("s_")) < 4 or not matches:
            raise NotFoundError("session", prefix)
        if len(matches) > 1:
            raise AmbiguousId("session", prefix, sorted(matches))
        return self.sessions[matches[0]]

    def list_sessions(self, *, include_finished: bool = False) -> list[Session]:
        found = [s for s in self.sessions.values() if include_finished or not s.finished]
        return sorted(found, key=lambda s: s.started_at or 0, reverse=True)

    def poll(self, session_id: str) -> Snapshot:
        session = self.get(session_id)
        text = bytes(self.outputs[session_id]).decode("utf-8", "replace")
        return Snapshot(session=session, output=text, output_cut=0)

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
                        outcome=WaitOutcome.INTERRUPTED, snapshot=self.poll(session_id)
                    )
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return WaitResult(outcome=WaitOutcome.TIMEOUT, snapshot=self.poll(session_id))
                self._cond.wait(0.05 if remaining is None else min(0.05, remaining))
        return WaitResult(outcome=WaitOutcome.FINISHED, snapshot=self.poll(session_id))

    def read_log(
        self,
        session_id: str,
        *,
        head: int | None = None,
        tail_lines: int | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> bytes:
        self.get(session_id)
        data = bytes(self.outputs[session_id])
        if byte_range is not None:
            return data[byte_range[0] : byte_range[1]]
        if head is not None:
            return data[:head]
        if tail_lines is not None:
            lines = data.splitlines(keepends=True)
            return b"".join(lines[-tail_lines:]) if tail_lines else b""
        return data

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
        return self.poll(session_id)

    def adopt(self) -> list[Session]:
        return []

    def prune(self, *, now: float | None = None) -> int:
        return 0

    def add_finish_listener(self, listener: FinishListener) -> None:
        self._listeners.append(listener)

    def _notify(self, session: Session) -> None:
        for listener in list(self._listeners):
            listener(session)


def owner(kind: str, ident: str) -> Owner:
    """Shorthand for tests: ``owner("kanban", "r1")``."""
    return Owner(kind=kind, id=ident)


__all__: Sequence[str] = ("FakeRegistry", "owner")
