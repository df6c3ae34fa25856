"""Reconciling: bringing a stored session in line with its files and processes.

A session nobody here follows is reconciled whenever it is read (:meth:`Reconciler.refresh`):
an exit record settles it, a live keeper (or unit) keeps it running, a vanished one makes it
``lost``. :meth:`Reconciler.adopt` re-attaches an instance to the keepers recorded as running
(after a restart) and hands them to the follower, whose callbacks land here too. This part
also collects the keepers this instance started once they end.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from registry.abc import Session
from registry.keeper.files import KeeperInfo, SessionDir
from registry.lifecycle.finalize import Finalizer
from registry.lifecycle.parts import Parts
from registry.live.follower import Followed
from registry.output.log import LogReader
from registry.output.tail import OutputTail
from registry.proc.identity import Identity, alive
from registry.store.sessions import Placed, Started, StoredSession
from scope.abc import Placement
from scope.cgroup import enclosing_unit, own_cgroup
from scope.errors import ScopeError
from scope.foundation.procstat import read_stat
from scope.unitname import is_ours

__all__ = ["STARTING_GRACE", "Reconciler", "identity", "late_placement"]

_log = logging.getLogger("dispatch.registry")

STARTING_GRACE = 30.0
"""A row with no keeper yet is "starting" this long before it counts as lost."""


def identity(pid: int | None, start: int | None) -> Identity | None:
    """A process identity from stored columns (None unless both are known)."""
    if pid is None or start is None:
        return None
    return Identity(pid=pid, start=start)


def late_placement(session_id: str, info: KeeperInfo) -> Placed | None:
    """The placement of a keeper whose launcher died before recording it, read from the
    keeper's cgroup; None unless it runs in a scope made for this session.

    Launchers before the record gate stored the row as a draft (in process, no unit), opened
    the keeper's gate and only then recorded where the keeper was placed. Killed in between,
    they left a worker running in its scope on a row that says otherwise (today's keepers wait
    for the record; a state dir carried over an upgrade may still hold such a worker), so a kill
    would skip the unit's cgroup-empty confirmation. The keeper's identity is checked first: a
    reused pid's cgroup says nothing.
    """
    if info.keeper_start is None:
        return None
    try:
        stat = read_stat(info.keeper_pid)
        if stat is None or stat.start_time != info.keeper_start:
            return None
        unit = enclosing_unit(own_cgroup(info.keeper_pid))
    except (OSError, LookupError, ValueError):
        return None  # gone meanwhile, or no cgroup v2: nothing to learn
    if unit is None or not is_ours(unit) or session_id not in unit:
        return None
    return Placed(
        placement=Placement.SCOPED,
        unit=unit,
        keeper_pid=info.keeper_pid,
        keeper_start=info.keeper_start,
        warning="placement recorded late: the launcher ended before recording it",
    )


class Reconciler:
    """Refreshes, adopts and follows sessions; reaps this instance's keepers."""

    def __init__(self, parts: Parts, finalizer: Finalizer) -> None:
        self.parts = parts
        self.finalizer = finalizer

    def refresh(self, stored: StoredSession, *, reap: bool = True) -> StoredSession:
        """Reconcile a running session nobody here follows with its files and processes
        (``reap``: collect our ended keepers first; callers looping over sessions do it once)."""
        parts = self.parts
        if reap:
            self.reap_children()
        session = stored.session
        if session.finished or parts.tracking.followed(session.id):
            return stored
        stored = self.note_keeper_info(stored)
        session = stored.session
        sdir = SessionDir(Path(stored.dir))
        damage = sdir.damage()
        if damage is not None:  # one damaged session is lost; the others carry on
            self.finalizer.settle(session.id, lost=f"session directory damaged: {damage}")
            return parts.load(session.id)
        if sdir.has_exit():
            self.finalizer.settle(session.id)
            return parts.load(session.id)
        keeper = identity(session.keeper_pid, session.keeper_start)
        child = parts.tracking.child(session.id)
        if child is not None and child.poll() is None:
            return stored
        if keeper is not None and alive(keeper):
            return stored
        if keeper is None and parts.clock.time() - stored.created_at < STARTING_GRACE:
            return stored
        if session.unit and self.unit_alive(session.unit):
            return stored
        if sdir.has_exit():  # written just before the keeper exited
            self.finalizer.settle(session.id)
        else:
            self.finalizer.settle(session.id, lost=self.finalizer.lost_reason(stored, child))
        return parts.load(session.id)

    def note_keeper_info(self, stored: StoredSession) -> StoredSession:
        """Copy keeper.json's facts into the row when it does not have them yet; the row as
        it is then."""
        session = stored.session
        if session.worker_pid is not None:
            return stored
        info = SessionDir(Path(stored.dir)).read_keeper()
        if info is None:
            return stored
        first = session.keeper_pid is None  # a row that never learned its keeper
        if first:
            placed = late_placement(session.id, info)
            if placed is not None:
                self.parts.store.update(session.id, placed)
        change = Started(
            worker_pid=info.worker_pid,
            worker_start=info.worker_start,
            started_at=info.started_at,
            keeper_pid=info.keeper_pid if first else None,
            keeper_start=info.keeper_start if first else None,
        )
        updated = self.parts.store.update_and_get(session.id, change)
        if updated is None:
            return self.parts.load(session.id)  # gone meanwhile: says so (NotFoundError)
        return updated

    def unit_alive(self, unit: str) -> bool:
        """Whether the unit still holds a process. A scope-layer failure (the manager may be
        gone) answers "not alive": nothing can confirm it. Any other error is a bug and
        propagates rather than marking a live session ``lost``."""
        try:
            pids = self.parts.scoper.unit_pids(unit)
        except ScopeError as err:
            _log.debug("unit_pids(%s) failed: %s", unit, err)
            return False
        return bool(pids)

    def reap_children(self) -> None:
        """Collect keepers of ours that ended (nobody else can; a follower does its own)."""
        tracking = self.parts.tracking
        with tracking.lock:
            items = list(tracking.children.items())
        for session_id, child in items:
            if child.poll() is not None and not tracking.followed(session_id):
                with tracking.lock:
                    tracking.children.pop(session_id, None)

    def forget_child(self, session_id: str) -> None:
        """Stop tracking the keeper of a session (reaping it if it ended)."""
        tracking = self.parts.tracking
        with tracking.lock:
            child = tracking.children.pop(session_id, None)
        if child is not None:
            child.poll()

    def adopt(self) -> list[Session]:
        """Re-attach to every session recorded as running (see :meth:`Registry.adopt`)."""
        tracking = self.parts.tracking
        changed: list[Session] = []
        self.reap_children()
        for stored in self.parts.store.running():
            session = stored.session
            if tracking.followed(session.id):
                continue
            refreshed = self.refresh(stored, reap=False)
            if refreshed.session.finished:
                changed.append(refreshed.session)
                continue
            if tracking.follower is not None:
                self.follow(refreshed, tracking.child(session.id), fresh=False)
                changed.append(refreshed.session)
        return changed

    def follow(
        self, stored: StoredSession, process: subprocess.Popen[bytes] | None, *, fresh: bool
    ) -> None:
        """Hand a running session to the follower (``fresh``: just spawned, read from the
        start; else adopted, only the end of its log matters)."""
        follower = self.parts.tracking.follower
        assert follower is not None
        settings = self.parts.settings
        session = stored.session
        reader = LogReader(session.log_path)
        tail = OutputTail(settings.tail_chars)
        if not fresh:
            size = reader.size()
            skip = max(0, size - 4 * settings.tail_chars)
            if skip:
                reader.offset = skip
                tail.skip(skip)
        keeper = identity(session.keeper_pid, session.keeper_start)
        unit = None
        if keeper is None or not alive(keeper):
            unit = session.unit
        sink = self.parts.notifier.attach(stored)
        follower.add(
            Followed(
                session_id=session.id,
                dir=SessionDir(Path(stored.dir)),
                reader=reader,
                tail=tail,
                keeper=keeper,
                worker=identity(session.worker_pid, session.worker_start),
                process=process if process is not None and process.poll() is None else None,
                unit=unit,
                sink=sink,
            )
        )

    def on_exit_record(self, entry: Followed) -> bool:
        """Follower callback: the keeper wrote its exit record."""
        return self.finalizer.settle(entry.session_id).finished

    def on_keeper_gone(self, entry: Followed) -> None:
        """Follower callback: the keeper of a followed session is gone."""
        stored = self.parts.store.get(entry.session_id)
        if stored is None:
            return
        if not stored.session.finished:
            if entry.dir.has_exit():
                self.finalizer.settle(entry.session_id)
            elif entry.session_id in self.parts.tracking.killing:
                pass  # kill() is finishing it with what it knows (the signal it sent)
            else:
                reason = self.finalizer.lost_reason(stored, entry.process)
                self.finalizer.settle(entry.session_id, lost=reason)
        else:
            self.finalizer.announce(stored.session)
            self.finalizer.settle_counts(stored, entry.dir)
        self.forget_child(entry.session_id)
