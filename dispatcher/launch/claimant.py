"""Who claimed a run or a fire: the claiming process's pid, kernel start time and boot id.

A claim whose worker was never recorded is settled by somebody else only when its claimant is
confirmed gone: no such process, the same pid with another start time (the pid was reused), or
another boot (start times count from boot, so the pair means nothing across a reboot). A bare
pid is never trusted, and a claimant that cannot be confirmed either way counts as alive:
nothing is reclaimed on a guess.

``instance`` tells apart several claimants inside one process (two schedulers in a test, a
command run inside the gateway); it is not part of the liveness check.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Claimant"]


@dataclass(frozen=True, kw_only=True)
class Claimant:
    """The identity of a claiming process (see the module docstring)."""

    pid: int
    start: int | None
    """Kernel start time in clock ticks since boot (None: could not be read)."""
    boot: str | None
    """The boot id the process ran under (None: not recorded, e.g. an older row)."""
    instance: str = ""

    @classmethod
    def current(cls, *, instance: bool = False) -> Claimant:
        """This process; with ``instance`` also a random part that names this claimant alone."""
        # /proc readers imported here: reading the board (every short write command loads
        # this record) never asks who a claimant is.
        from scope.foundation.procstat import boot_id, start_time

        pid = os.getpid()
        return cls(
            pid=pid,
            start=start_time(pid),
            boot=boot_id(),
            instance=os.urandom(4).hex() if instance else "",
        )

    def alive(self) -> bool:
        """Whether the claiming process still runs (see the module docstring)."""
        from scope.foundation.procstat import boot_id, start_time

        if self.boot is not None:
            current = boot_id()
            if current is not None and current != self.boot:
                return False  # another boot: every process of that boot is gone
        now = start_time(self.pid)  # a zombie counts as gone: it will never record anything
        if now is None:
            return False
        return self.start is None or now == self.start

    def token(self) -> str:
        """One string for a text column: ``pid:start:boot:instance``."""
        return f"{self.pid}:{self.start or 0}:{self.boot or ''}:{self.instance}"

    @classmethod
    def parse(cls, token: str | None) -> Claimant | None:
        """The claimant a :meth:`token` names (None for nothing or garbage). Also reads the
        older ``pid:start:random`` form, which carried no boot id."""
        if not token:
            return None
        parts = token.split(":")
        try:
            pid, start = int(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            return None
        if len(parts) == 3:  # pid:start:random, written before boot ids were recorded
            return cls(pid=pid, start=start or None, boot=None, instance=parts[2])
        if len(parts) != 4:
            return None
        return cls(pid=pid, start=start or None, boot=parts[2] or None, instance=parts[3])

    def __str__(self) -> str:
        return f"pid {self.pid}"
