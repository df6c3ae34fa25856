"""The kill policy: stop a worker and everything it started, and prove nothing survives.

Scoped sessions: :meth:`Scoper.stop` (SIGTERM the whole cgroup, SIGKILL after the grace,
confirm ``cgroup.procs`` is empty). Everything else: SIGTERM the worker's process group and the
other processes found for the session, wait the grace, SIGKILL whatever of a pre-signal snapshot
plus a fresh one still runs, then check for survivors for up to a second. The scoped path runs
the same sweep afterwards, so a process that escaped the cgroup (or a fake scoper's coarser
"unit") is not missed.

The processes of a session are: the worker's process group (only while its leader is the
recorded worker, or members started after it once the leader is gone), the descendants of the
worker and of everything already found, and every process whose environment carries the
session's marker (``DISPATCH_SESSION_ID``; that finds double-forked daemons re-parented to
init). The keeper is never among them: it must live to write the exit record. Every signal
goes through a pidfd after the start time was re-checked (:func:`registry.proc.identity.send`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from registry.proc.identity import Identity, alive, descendants, group, marked, send, table
from scope.abc import Scoper
from scope.foundation.procstat import read_stat

__all__ = ["KillOutcome", "session_processes", "stop_session"]

_log = logging.getLogger("dispatch.registry")

CONFIRM = 1.0
"""The survivor check after SIGKILL (seconds)."""


@dataclass(frozen=True, kw_only=True)
class KillOutcome:
    """What a kill achieved."""

    stopped: bool
    """Nothing of the session survives."""
    signal: str | None
    """The strongest signal that had to be sent (None: nothing was running)."""
    survivors: tuple[Identity, ...] = ()
    ignored_term: tuple[Identity, ...] = ()
    """Processes still running when the grace after SIGTERM ran out."""


def session_processes(
    session_id: str, worker: Identity | None, keeper: Identity | None
) -> set[Identity]:
    """Every live process of the session except the keeper (one pass over /proc)."""
    procs = table()
    found: set[Identity] = set()
    if worker is not None:
        leader = procs.get(worker.pid)
        members = group(procs, worker.pid)
        if leader is not None and leader.start_time == worker.start:
            found |= members
        elif leader is None:
            # The leader is gone; its group id cannot have been reused while members hold it,
            # and members started before the worker cannot be its descendants.
            found |= {m for m in members if m.start >= worker.start}
        found |= descendants(procs, [worker])
    found |= marked(procs, session_id)
    found |= descendants(procs, list(found))
    me = os.getpid()
    return {p for p in found if p != keeper and p.pid != me}


def _signal_group(worker: Identity | None, sig: int) -> None:
    """killpg the worker's group when its leader (possibly a zombie) is still the worker."""
    if worker is None:
        return
    try:
        pidfd = os.pidfd_open(worker.pid)
    except OSError:
        return
    try:
        # The pidfd pins the pid number, so the group id checked here is the one signalled.
        stat = read_stat(worker.pid)
        if stat is not None and stat.start_time == worker.start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.pid, sig)
    finally:
        os.close(pidfd)


def _signal_all(targets: set[Identity], worker: Identity | None, sig: int) -> None:
    _signal_group(worker, sig)
    for ident in sorted(targets):
        send(ident, sig)


def _wait_gone(
    session_id: str,
    worker: Identity | None,
    keeper: Identity | None,
    known: set[Identity],
    bound: float,
) -> set[Identity]:
    """Poll until nothing of the session runs or ``bound`` passes; returns what still runs."""
    deadline = time.monotonic() + bound
    delay = 0.005
    while True:
        known |= session_processes(session_id, worker, keeper)
        live = {p for p in known if alive(p)}
        if not live or time.monotonic() >= deadline:
            return live
        # Processes die asynchronously after a signal; this poll is bounded by the deadline.
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.05)


def stop_session(
    *,
    session_id: str,
    worker: Identity | None,
    keeper: Identity | None,
    unit: str | None,
    scoper: Scoper | None,
    grace: float,
    before_signal: Callable[[], None] | None = None,
) -> KillOutcome:
    """Stop everything of a session (see the module docstring). Never raises for a process
    that is already gone; reports survivors instead of claiming success. ``before_signal``
    runs once, just before the first signal (or scope stop), and not at all when nothing
    had to be signalled."""
    before = session_processes(session_id, worker, keeper)
    strongest: str | None = None
    if unit is not None and scoper is not None:
        if before_signal is not None:
            before_signal()
        result = scoper.stop(unit, grace=grace)
        strongest = result.signal
        for pid in result.survivors:
            stat = read_stat(pid)
            if stat is not None and stat.state not in ("Z", "X"):
                before.add(Identity(pid=pid, start=stat.start_time))
        live = {p for p in before if alive(p)}
        live |= session_processes(session_id, worker, keeper)
        if live:
            _signal_all(live, worker, signal.SIGTERM)
            strongest = strongest or "SIGTERM"
            live = _wait_gone(session_id, worker, keeper, live, grace)
    else:
        live = {p for p in before if alive(p)}
        worker_running = worker is not None and alive(worker)
        if live or worker_running:
            if before_signal is not None:
                before_signal()
            _signal_all(live, worker, signal.SIGTERM)
            strongest = "SIGTERM"
            live = _wait_gone(session_id, worker, keeper, set(live), grace)
    ignored = tuple(sorted(live))
    if live:
        for ident in ignored:
            _log.warning(
                "session %s: pid %d (%s) ignored SIGTERM for %gs; sending SIGKILL "
                "(registry.kill_grace sets the grace)",
                session_id,
                ident.pid,
                _comm(ident.pid),
                grace,
            )
        _signal_all(live, worker, signal.SIGKILL)
        strongest = "SIGKILL"
        live = _wait_gone(session_id, worker, keeper, set(live), CONFIRM)
        if live:
            # Re-sent once: something forked between the snapshot and the signal.
            _signal_all(live, worker, signal.SIGKILL)
            live = _wait_gone(session_id, worker, keeper, set(live), CONFIRM)
    return KillOutcome(
        stopped=not live,
        signal=strongest,
        survivors=tuple(sorted(live)),
        ignored_term=ignored,
    )


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return "?"
