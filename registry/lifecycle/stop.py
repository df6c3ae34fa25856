"""Stopping: a registry kill, from the recorded intent to the final state.

The intent (state to record, reason, time) is stored before anything is signalled, so that
whichever instance finalizes the session records ``killed`` (or ``timed_out``) rather than a
plain exit; the kill policy itself (identity, escalation, survivors) is :mod:`registry.proc.kill`.
A kill never reports a final state while something survives. Every time recorded (the intent,
the first signal, a fallback end) is the injected clock's; only the waits for other processes
are real, bounded polls.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from registry.abc import Session, SessionState, Snapshot
from registry.errors import RegistryError
from registry.keeper.files import ExitRecord, SessionDir
from registry.lifecycle.finalize import Finalizer
from registry.lifecycle.parts import Parts
from registry.lifecycle.reconcile import Reconciler, identity
from registry.lifecycle.view import Viewer
from registry.proc.identity import Identity, alive
from registry.proc.kill import stop_session
from registry.store.sessions import KillIntent, StoredSession
from scope.abc import Placement

__all__ = ["Stopper"]


class Stopper:
    """Kills sessions (see :meth:`registry.abc.Registry.kill`)."""

    def __init__(
        self, parts: Parts, finalizer: Finalizer, reconciler: Reconciler, viewer: Viewer
    ) -> None:
        self.parts = parts
        self.finalizer = finalizer
        self.reconciler = reconciler
        self.viewer = viewer

    def kill(
        self,
        session_id: str,
        *,
        grace: float | None = None,
        state: SessionState = SessionState.KILLED,
        reason: str = "killed by request",
    ) -> Snapshot:
        """Stop the worker and everything it started; return its final snapshot."""
        parts, tracking = self.parts, self.parts.tracking
        stored = self.reconciler.refresh(parts.load(session_id))
        session = stored.session
        if session.finished:
            return self.viewer.snapshot(stored, "kill")
        grace = parts.settings.kill_grace if grace is None else max(0.0, grace)
        state = SessionState(state)
        # The registry's clock: wall time under the SystemClock, so the keeper's exit time
        # compares with it (finalize.py); a test's FakeClock stamps the intent instead.
        intent = KillIntent(state=state, reason=reason, requested_at=parts.clock.time())
        parts.store.record_kill(session.id, intent)
        with tracking.lock:
            tracking.killing.add(session.id)
        try:
            final = self._kill(stored, intent, grace)
        finally:
            with tracking.lock:
                tracking.killing.discard(session.id)
        if not final.finished:
            raise RegistryError(f"session {session.id} did not finish", session=session.id)
        return self.viewer.snapshot(parts.load(session.id), "kill")

    def _kill(self, stored: StoredSession, intent: KillIntent, grace: float) -> Session:
        parts = self.parts
        session = stored.session
        keeper = identity(session.keeper_pid, session.keeper_start)
        outcome = stop_session(
            session_id=session.id,
            worker=identity(session.worker_pid, session.worker_start),
            keeper=keeper,
            unit=session.unit if session.placement is Placement.SCOPED else None,
            scoper=parts.scoper,
            grace=grace,
            before_signal=lambda: parts.store.mark_signalled(session.id, parts.clock.time()),
        )
        if not outcome.stopped:
            pids = ", ".join(str(p.pid) for p in outcome.survivors)
            raise RegistryError(
                f"could not kill session {session.id}: {len(outcome.survivors)} process(es) "
                f"survive SIGKILL (pid {pids})",
                remedy="they may be stuck in the kernel (state D); check 'ps -o pid,stat,cmd'",
                session=session.id,
            )
        sdir = SessionDir(Path(stored.dir))
        child = parts.tracking.child(session.id)
        _await(lambda: sdir.has_exit() or not _keeper_alive(keeper, child), 3.0)
        if sdir.has_exit():
            return self.finalizer.settle(session.id)
        # The keeper went down with the worker (a scope stop SIGKILLs both) or is stuck:
        # record what we know; the strongest signal we had to send is what ended it.
        fallback = ExitRecord(
            state=intent.state,
            exit_code=None,
            signal=outcome.signal,
            reason=f"{intent.reason} ({outcome.signal})" if outcome.signal else intent.reason,
            started_at=session.started_at,
            finished_at=parts.clock.time(),
            total_bytes=sdir.log_size(),
            writer="registry",
        )
        if not _keeper_alive(keeper, child):
            with contextlib.suppress(OSError):
                sdir.write_exit(fallback)
        final = self.finalizer.settle(session.id, fallback=fallback)
        if (
            final.state is intent.state
            and final.signal is None
            and final.exit_code is None
            and outcome.signal
        ):
            # Another instance finalized first without knowing the signal: correct the row
            # and its completion event together.
            parts.store.amend_signal(session.id, outcome.signal)
            final = parts.load(session.id).session
        return final


def _keeper_alive(keeper: Identity | None, child: subprocess.Popen[bytes] | None) -> bool:
    if child is not None:
        return child.poll() is None
    return keeper is not None and alive(keeper)


def _await(predicate: Callable[[], bool], bound: float) -> bool:
    deadline = time.monotonic() + bound
    delay = 0.002
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        # A bounded poll for another process's file; no event tells us about it.
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True
