"""One ``dispatch serve`` per state dir: an advisory lock plus a record of who holds it.

The lock is ``flock`` on ``<state_dir>/serve.lock``; the kernel drops it when the holder dies,
so a crashed gateway never blocks the next one. The file also records the holder's pid, kernel
start time and start wall time so ``dispatch status`` and a refused second ``serve`` can name it.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from dispatcher.errors import GatewayError
from registry.store.database import StateDirUnusable
from scope.foundation.procstat import start_time

LOCK_NAME = "serve.lock"


@dataclass(frozen=True, kw_only=True)
class Holder:
    """Who holds (or last held) the serve lock."""

    pid: int
    start_ticks: int | None
    started_at: float


class ServeLock:
    """Hold the lock for the lifetime of a gateway."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> Holder:
        """Take the lock or raise :class:`GatewayError` naming the running gateway's pid
        (:class:`~registry.store.database.StateDirUnusable` when the file cannot be written)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise StateDirUnusable.from_os_error(self.path.parent, err, "is not writable") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_holder(Path(self.path).parent)
            pid = holder.pid if holder else "unknown"
            raise GatewayError(
                f"another dispatch serve is already running on this state dir (pid {pid})",
                remedy="stop it first, or pass a different --state-dir",
                pid=pid,
            ) from None
        me = Holder(pid=os.getpid(), start_ticks=start_time(os.getpid()), started_at=time.time())
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me.__dict__).encode(), 0)
        self._fd = fd
        return me

    def release(self) -> None:
        """Drop the lock (the record stays; it is only trusted while the lock is held)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_holder(state_dir: Path) -> Holder | None:
    """The recorded holder, if the lock is currently held by a live process; else None."""
    path = Path(state_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held: the record is current
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None  # nobody holds it
        raw = os.pread(fd, 4096, 0)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
        return Holder(
            pid=int(data["pid"]), start_ticks=data.get("start_ticks"), started_at=data["started_at"]
        )
    except (ValueError, KeyError, TypeError):
        return None
