"""Process identity and process trees from /proc, and signalling only confirmed processes.

A process is identified by its pid plus its kernel start time (``/proc/PID/stat`` field 22);
a bare pid is never trusted. :func:`send` opens a pidfd first and re-checks the start time
through it, so a signal can never reach a process that took over a recycled pid.

:func:`table` reads every process once; the kill policy derives from that one pass the worker's
process group, the descendants of the recorded pids (a double-forked grandchild that left the
group is still found while its parent lives, or by the session's environment marker once it is
orphaned) and the processes carrying the marker.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from registry.environment import MARKER_ENV
from scope.foundation.procstat import ProcStat, read_stat

__all__ = [
    "Identity",
    "alive",
    "descendants",
    "group",
    "identify",
    "marked",
    "send",
    "table",
]


@dataclass(frozen=True, kw_only=True, order=True)
class Identity:
    """A process as the kernel knows it."""

    pid: int
    start: int


def identify(pid: int) -> Identity | None:
    """The identity of a live (non-zombie) process, or None."""
    stat = read_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return None
    return Identity(pid=pid, start=stat.start_time)


def alive(ident: Identity) -> bool:
    """Whether this very process still runs (same start time, not a zombie)."""
    stat = read_stat(ident.pid)
    return stat is not None and stat.state not in ("Z", "X") and stat.start_time == ident.start


def table() -> dict[int, ProcStat]:
    """Every live process, by pid (one pass over /proc)."""
    found: dict[int, ProcStat] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = read_stat(int(name))
            if stat is not None and stat.state not in ("Z", "X"):
                found[stat.pid] = stat
    return found


def group(procs: dict[int, ProcStat], pgid: int) -> set[Identity]:
    """Members of process group ``pgid``."""
    return {Identity(pid=p.pid, start=p.start_time) for p in procs.values() if p.pgrp == pgid}


def descendants(procs: dict[int, ProcStat], roots: Iterable[Identity]) -> set[Identity]:
    """Every descendant of the live ``roots`` (not the roots themselves)."""
    children: dict[int, list[ProcStat]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p)
    found: set[Identity] = set()
    stack = [r.pid for r in roots if r.pid in procs and procs[r.pid].start_time == r.start]
    while stack:
        for child in children.get(stack.pop(), ()):
            ident = Identity(pid=child.pid, start=child.start_time)
            if ident not in found:
                found.add(ident)
                stack.append(child.pid)
    return found


def marked(procs: dict[int, ProcStat], session_id: str) -> set[Identity]:
    """Processes whose environment carries ``DISPATCH_SESSION_ID=<session_id>``."""
    needle = f"{MARKER_ENV}={session_id}".encode()
    found: set[Identity] = set()
    for p in procs.values():
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                data = f.read()
        except OSError:
            continue
        if needle in data.split(b"\0"):
            found.add(Identity(pid=p.pid, start=p.start_time))
    return found


def send(ident: Identity, sig: int) -> bool:
    """Signal ``ident`` if it is still that process; True when a signal was delivered."""
    try:
        pidfd = os.pidfd_open(ident.pid)
    except (ProcessLookupError, OSError):
        return False
    try:
        if not alive(ident):
            return False
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)
