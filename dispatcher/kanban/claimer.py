"""Who claimed a run: the claiming process's pid plus kernel start time.

A run that was claimed but whose spawn was never recorded is reclaimed only when its claimer is
confirmed gone: same pid with a different start time (the pid was reused) or no such process.
A bare pid is never trusted.
"""

from __future__ import annotations

import os

from dispatcher.kanban.model import Claimer
from scope.foundation.procstat import start_time


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
    # start_time() counts a zombie as gone: it will never record a spawn.
    now = start_time(pid)
    if now is None:
        return False
    return start is None or now == start
