"""Finalizing: the one place a session becomes final, and what follows from it.

:meth:`Finalizer.settle` stores the final state from the exit record (or a fallback the
caller knows, or "lost") with a compare-and-set on ``running``, so exactly one registry
instance stores it and :meth:`Finalizer.published` runs once per session; the completion event
of a notifying session is stored in that same transaction. Listeners and waiters of this
instance are told in :meth:`Finalizer.announce`.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
from pathlib import Path

from registry.abc import Event, EventType, Session, SessionState
from registry.keeper.files import ExitRecord, SessionDir
from registry.lifecycle.parts import Parts
from registry.lifecycle.view import Viewer
from registry.store.events import EventDraft
from registry.store.sessions import Counted, FinalFields, StoredSession
from registry.usage import oom_reason, runtime_max_text

__all__ = ["Finalizer"]

_log = logging.getLogger("dispatch.registry")


class Finalizer:
    """Settles sessions, drafts their completions, announces their end."""

    def __init__(self, parts: Parts, viewer: Viewer) -> None:
        self.parts = parts
        self.viewer = viewer

    def settle(
        self,
        session_id: str,
        *,
        fallback: ExitRecord | None = None,
        lost: str | None = None,
    ) -> Session:
        """Store the final state from the exit record (or ``fallback``, or ``lost``) unless
        another instance did already; the one place a session becomes final."""
        parts, tracking = self.parts, self.parts.tracking
        stored = parts.load(session_id)
        if stored.session.finished:
            if tracking.followed(session_id):
                self.announce(stored.session)
            return stored.session
        sdir = SessionDir(Path(stored.dir))
        record = sdir.read_exit() or fallback
        if record is None and lost is not None:
            record = self._lost_record(stored, sdir, lost)
        if record is None:
            return stored.session
        final_record = record
        completion = None
        pending = stored.session
        if pending.notify or pending.heartbeat is not None or pending.watch:
            # Watch events of the last lines come before the completion.
            parts.notifier.before_final(session_id)
            completion = self.completion_draft(stored, self.final_fields(stored, record))
        won, event = parts.store.finalize(
            session_id,
            lambda current: self.final_fields(current, final_record),
            completion=completion,
            now=parts.clock.time(),
        )
        parts.notifier.detach(session_id)
        session = parts.load(session_id).session
        if won:
            self.published(session, event)
        if won or tracking.followed(session_id):
            self.announce(session)
        return session

    def _lost_record(self, stored: StoredSession, sdir: SessionDir, lost: str) -> ExitRecord:
        """The record of a keeper that vanished (written for later readers, if it can be)."""
        if stored.kill is not None:
            # The keeper went down with a kill (a scope stop reaches it too).
            state, lost = stored.kill.state, f"{stored.kill.reason} (no exit record: {lost})"
        else:
            state = SessionState.LOST
        record = ExitRecord(
            state=state,
            exit_code=None,
            signal=None,
            reason=lost,
            started_at=stored.session.started_at,
            finished_at=self.parts.clock.time(),
            total_bytes=sdir.log_size(),
            writer="registry",
        )
        with contextlib.suppress(OSError):
            sdir.write_exit(record)
        return record

    def completion_draft(self, stored: StoredSession, final: FinalFields) -> EventDraft:
        """The completion event of a session about to be finalized with ``final`` (stored
        only if the session notifies; the note and watch summary are added by the store)."""
        view = self.viewer.view(stored, self.viewer.chars(stored), final=True)
        return EventDraft(
            type=EventType.COMPLETION,
            state=final.state,
            exit_code=final.exit_code,
            signal=final.signal,
            completion_reason=final.completion_reason,
            output=self.viewer.handed(view.text, stored.session, final.exit_code, "completion"),
            output_cut=view.cut + final.dropped_bytes,
            log_path=stored.session.log_path,
            data={
                "total_bytes": final.total_bytes,
                "dropped_bytes": final.dropped_bytes,
                "finished_at": final.finished_at,
            },
        )

    def final_fields(self, stored: StoredSession, record: ExitRecord) -> FinalFields:
        """The final columns an exit record gives, with a kill in progress taken into
        account."""
        state = record.state
        reason = record.reason
        intent = stored.kill
        if (
            intent is not None
            and state is SessionState.EXITED
            and record.writer == "keeper"
            and intent.signalled_at is not None
            and (record.signal is not None or (record.finished_at or 0.0) >= intent.signalled_at)
        ):
            # Our signal ended it; an exit before the first signal went out stays an exit,
            # with its own code (the kill merely raced it).
            state = intent.state
            reason = f"{intent.reason} ({record.reason})"
        if state is SessionState.EXITED and record.unit_result == "timeout":
            # The manager stopped the scope at its RuntimeMaxSec= (the keeper asked it while
            # the stop was under way); a stop by anyone else leaves the Result "success".
            state = SessionState.TIMED_OUT
            reason = f"{runtime_max_text(stored.session.resources)}; {record.reason}"
        oom = oom_reason(
            exited=state is SessionState.EXITED,
            signal=record.signal,
            exit_code=record.exit_code,
            usage=record.usage,
        )
        if oom is not None:
            reason = oom
        started = None
        if stored.session.started_at is None and record.started_at is not None:
            started = record.started_at
        return FinalFields(
            state=state,
            exit_code=record.exit_code,
            signal=record.signal,
            finished_at=record.finished_at or self.parts.clock.time(),
            completion_reason=reason,
            total_bytes=int(record.total_bytes or 0),
            dropped_bytes=int(record.dropped_bytes or 0),
            started_at=started,
            usage=record.usage,
        )

    def published(self, session: Session, event: Event | None) -> None:
        """Runs exactly once per session, in the instance that stored its final state (the
        publisher of its completion, already stored with that state)."""
        _log.debug("session %s finished: %s", session.id, session.completion_reason)
        self.parts.notifier.emit(event)

    def announce(self, session: Session) -> None:
        """Wake waiters and call the finish listeners (once per session per instance).

        The remembered ids are bounded by pruning (``registry.max_sessions``), which forgets
        the ids of the rows it deletes."""
        tracking = self.parts.tracking
        with tracking.lock:
            tracking.changed.notify_all()
            if session.id in tracking.announced:
                return
            tracking.announced.add(session.id)
            listeners = list(tracking.listeners)
        for listener in listeners:
            try:
                listener(session)
            except Exception:
                _log.exception("finish listener failed for session %s", session.id)

    def lost_reason(self, stored: StoredSession, process: subprocess.Popen[bytes] | None) -> str:
        """Why a session is lost, in words (what the keeper said before it went, if
        anything)."""
        parts = ["keeper vanished without an exit record"]
        if stored.session.keeper_pid is None and stored.session.worker_pid is None:
            parts = ["the keeper never started"]
        if process is not None and process.returncode is not None:
            code = process.returncode
            parts.append(
                f"keeper exit status {code}" if code >= 0 else f"keeper killed by signal {-code}"
            )
        detail = SessionDir(Path(stored.dir)).keeper_errors()
        if detail:
            parts.append(f"keeper said: {detail}")
        return "; ".join(parts)

    def settle_counts(self, stored: StoredSession, sdir: SessionDir) -> None:
        """After the drain: the keeper's last record may count bytes that came late."""
        record = sdir.read_exit()
        if record is not None and record.final and record.total_bytes > stored.session.total_bytes:
            self.parts.store.update(
                stored.session.id,
                Counted(total_bytes=record.total_bytes, dropped_bytes=record.dropped_bytes),
            )
