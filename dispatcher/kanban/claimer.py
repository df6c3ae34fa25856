"""Who claimed a run: the claiming process's pid plus kernel start time.

A run that was claimed but whose spawn was never recorded is reclaimed only when its claimer is
confirmed gone: same pid with a different start time (the pid was reused) or no such process.
A bare pid is never trusted.
"""

from __future__ import annotations

import os

from dispatcher.kanban.model import Claimer


def start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (field 22 of ``/proc/PID/stat``), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    try:
        # The command name is parenthesised and may contain spaces or ')': split after the last.
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def current_claimer() -> Claimer:
    """This process as a claimer."""
    pid = os.getpid()
    return Claimer(pid=pid, start=start_time(pid))


def claimer_alive(pid: int | None, start: int | None) -> bool:
    """True when the process ``pid`` with kernel start time ``start`` still exists.

    Without a recorded start time the process cannot be confirmed, so a live pid counts as
    alive (never reclaim on a guess); a missing pid counts as gone."""
    if pid is None:
        return False
    now = start_time(pid)
    if now is None:
        return False
    # A zombie still has its /proc entry but will never record a spawn.
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
        state = data[data.rindex(b")") + 2 :].split()[0]
    except (OSError, ValueError, IndexError):
        state = b"?"
    if state in (b"Z", b"X"):
        return False
    return start is None or now == start
