"""The follower: one thread per registry instance that watches every followed session.

For each session it tails the log into an :class:`~registry.output.tail.OutputTail` and notices two
events through pidfds (no polling needed for them): the *worker* exited (the keeper writes the
exit record within milliseconds, so the follower looks for ``exit.json`` on every tick until it
appears) and the *keeper* exited (everything is over: last read, then either the record exists
or the session is lost). Log reads back off for quiet sessions (up to ``idle_interval``) so
hundreds of adopted sessions cost little; a session that writes is read every ``interval``.

The follower decides nothing about states: it calls back into the registry, which owns the one
place where a session is finalized. It never signals anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from registry.errors import StateError
from registry.keeper.files import SessionDir
from registry.output.log import LogReader
from registry.output.tail import OutputTail
from registry.proc.identity import Identity, alive

__all__ = ["Followed", "Follower"]

_log = logging.getLogger("dispatch.registry")


@dataclass(eq=False, kw_only=True)
class Followed:
    """One followed session (mutated only under the follower's lock)."""

    session_id: str
    dir: SessionDir
    reader: LogReader
    tail: OutputTail
    keeper: Identity | None
    worker: Identity | None
    process: subprocess.Popen[bytes] | None = None
    """The keeper when it is our own child (reaped here)."""
    unit: str | None = None
    """Set when only the unit is known to be alive (the keeper pid is gone)."""
    keeper_fd: int = -1
    worker_fd: int = -1
    worker_exited: bool = False
    keeper_exited: bool = False
    finalized: bool = False
    interval: float = 0.0
    next_read: float = 0.0
    next_check: float = 0.0
    listeners_done: bool = False
    extra: dict[str, object] = field(default_factory=dict)
    sink: Callable[[int, bytes], None] | None = None
    """Also gets every chunk read, with its log position (watch patterns)."""


class Follower:
    """The thread and its set of followed sessions."""

    def __init__(
        self,
        *,
        on_exit_record: Callable[[Followed], bool],
        on_keeper_gone: Callable[[Followed], None],
        unit_alive: Callable[[str], bool],
        periodic: Callable[[], None] | None = None,
        periodic_every: float = 3600.0,
        interval: float = 0.05,
        idle_interval: float = 1.0,
    ) -> None:
        self._on_exit_record = on_exit_record
        self._on_keeper_gone = on_keeper_gone
        self._unit_alive = unit_alive
        self._periodic = periodic
        self._periodic_every = periodic_every
        self.interval = interval
        self.idle_interval = idle_interval
        self.lock = threading.RLock()
        self._entries: dict[str, Followed] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        self._wake_r, self._wake_w = -1, -1
        self._next_periodic = time.monotonic() + periodic_every

    # -- membership ------------------------------------------------------------------------------

    def add(self, entry: Followed) -> None:
        """Start following ``entry`` (the thread starts on first use)."""
        entry.keeper_fd = _pidfd(entry.keeper) if entry.process is None else _child_pidfd(entry)
        entry.worker_fd = _pidfd(entry.worker)
        if entry.worker is not None and entry.worker_fd < 0 and not alive(entry.worker):
            entry.worker_exited = True
        entry.interval = self.interval
        with self.lock:
            if self._stop:
                self._release(entry)
                return
            self._entries[entry.session_id] = entry
            if self._thread is None:
                self._wake_r, self._wake_w = os.pipe()
                os.set_blocking(self._wake_w, False)
                self._thread = threading.Thread(
                    target=self._loop, name="dispatch-registry-follower", daemon=True
                )
                self._thread.start()
        self.wake()

    def get(self, session_id: str) -> Followed | None:
        """The entry of a followed session (None when not followed)."""
        with self.lock:
            return self._entries.get(session_id)

    def __contains__(self, session_id: str) -> bool:
        with self.lock:
            return session_id in self._entries

    def catch_up(self, session_id: str) -> Followed | None:
        """Read what the log gained since the last tick (so a view is current)."""
        with self.lock:
            entry = self._entries.get(session_id)
            if entry is not None:
                _read(entry)
            return entry

    def wake(self) -> None:
        """Make the thread look at its sessions now."""
        if self._wake_w >= 0:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake_w, b"x")

    def close(self) -> None:
        """Stop the thread and release every handle; keepers keep running."""
        with self.lock:
            self._stop = True
            thread = self._thread
        self.wake()
        if thread is not None:
            thread.join(timeout=10)
        with self.lock:
            for entry in self._entries.values():
                self._release(entry)
            self._entries.clear()
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1
            self._thread = None

    # -- the loop --------------------------------------------------------------------------------

    def _loop(self) -> None:
        poller = select.poll()
        registered: set[int] = set()
        timeout = 0.0
        while True:
            with self.lock:
                if self._stop:
                    return
                wanted = {self._wake_r}
                for entry in self._entries.values():
                    wanted.update(fd for fd in (entry.keeper_fd, entry.worker_fd) if fd >= 0)
            for fd in registered - wanted:
                poller.unregister(fd)
            for fd in wanted - registered:
                poller.register(fd, select.POLLIN)
            registered = wanted
            ready = {fd for fd, _ in poller.poll(int(timeout * 1000))}
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            try:
                timeout = self._tick(ready)
            except StateError as err:  # named once per session; the state module says why
                _log.error("registry follower: %s", err)
                timeout = self.idle_interval
            except Exception:  # a bug here must not stop every completion
                _log.exception("registry follower tick failed")
                timeout = self.idle_interval

    def _tick(self, ready: set[int]) -> float:
        """One pass over every entry; returns how long the next poll may sleep."""
        now = time.monotonic()
        with self.lock:
            entries = list(self._entries.values())
        soonest = now + self.idle_interval
        for entry in entries:
            with self.lock:
                if entry.keeper_fd in ready or (
                    entry.keeper_fd < 0 and self._keeper_gone(entry, now)
                ):
                    entry.keeper_exited = True
                if entry.worker_fd in ready:
                    entry.worker_exited = True
                    _close_fd(entry, "worker_fd")
                if now >= entry.next_read or entry.worker_exited or entry.keeper_exited:
                    got = _read(entry)
                    entry.interval = (
                        self.interval if got else min(entry.interval * 2, self.idle_interval)
                    )
                    entry.next_read = now + entry.interval
            if entry.keeper_exited:
                self._complete(entry)
                continue
            if not entry.finalized and (entry.worker_exited or now >= entry.next_check):
                entry.next_check = now + entry.interval
                if entry.dir.has_exit():
                    with self.lock:
                        _read(entry)
                    entry.finalized = self._on_exit_record(entry)
            next_due = entry.next_read
            if entry.worker_exited and not entry.finalized:
                next_due = now + self.interval
            soonest = min(soonest, next_due)
        if self._periodic is not None and now >= self._next_periodic:
            self._next_periodic = now + self._periodic_every
            try:
                self._periodic()
            except Exception:
                _log.exception("registry periodic sweep failed")
        return max(0.0, soonest - time.monotonic())

    def _keeper_gone(self, entry: Followed, now: float) -> bool:
        """Liveness without a pidfd: the keeper's identity, or the unit's pids."""
        if now < entry.next_check:
            return False
        if entry.process is not None:
            return entry.process.poll() is not None
        if entry.keeper is not None and alive(entry.keeper):
            return False
        if entry.unit is not None:
            return not self._unit_alive(entry.unit)
        return True

    def _complete(self, entry: Followed) -> None:
        """The keeper is gone: last read, finalize if nobody did, release, forget."""
        with self.lock:
            _read(entry)
            entry.tail.finish()
        if entry.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                entry.process.wait(timeout=1)
        try:
            self._on_keeper_gone(entry)
        finally:
            # Even when finalizing failed (a damaged or full state database): the keeper's fd
            # stays readable at EOF and would spin this loop; a later adopt() finalizes it.
            with self.lock:
                self._release(entry)
                self._entries.pop(entry.session_id, None)

    def _release(self, entry: Followed) -> None:
        _close_fd(entry, "keeper_fd")
        _close_fd(entry, "worker_fd")


def _read(entry: Followed) -> int:
    start = entry.reader.offset
    data = entry.reader.read_new()
    entry.tail.feed(data)
    if data and entry.sink is not None:
        entry.sink(start, data)
    return len(data)


def _pidfd(ident: Identity | None) -> int:
    """A pidfd for a live process we have confirmed by start time (-1 when impossible)."""
    if ident is None:
        return -1
    try:
        fd = os.pidfd_open(ident.pid)
    except OSError:
        return -1
    if not alive(ident):
        # Gone (or a zombie) already: a pidfd of a stranger would never fire for us.
        os.close(fd)
        return -1
    return fd


def _child_pidfd(entry: Followed) -> int:
    """Our own child cannot be replaced before we reap it, so its pid is proof enough."""
    assert entry.process is not None
    try:
        return os.pidfd_open(entry.process.pid)
    except OSError:
        return -1


def _close_fd(entry: Followed, name: str) -> None:
    fd = getattr(entry, name)
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
        setattr(entry, name, -1)
