"""Read-only facts about processes from ``/proc/PID/stat``: identity and process-group members.

A pid alone is never trusted (pids are reused); a process is identified by its pid plus its kernel
start time (field 22 of ``stat``, in clock ticks since boot). Nothing here signals anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcStat", "boot_id", "boot_time", "group_members", "read_stat", "start_time"]


@dataclass(frozen=True, kw_only=True)
class ProcStat:
    """The fields of ``/proc/PID/stat`` we use."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start_time: int


def read_stat(pid: int, *, proc_root: str = "/proc") -> ProcStat | None:
    """Parse ``/proc/PID/stat``; None when the process does not exist (or vanished meanwhile)."""
    try:
        raw = Path(proc_root, str(int(pid)), "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    # The command name (field 2) may contain spaces and ')'; everything after the last ')' is
    # a fixed list of numeric fields starting with field 3 (state).
    tail = raw[raw.rindex(b")") + 2 :].split()
    return ProcStat(
        pid=int(pid),
        state=tail[0].decode(),
        ppid=int(tail[1]),
        pgrp=int(tail[2]),
        session=int(tail[3]),
        start_time=int(tail[19]),
    )


def start_time(pid: int) -> int | None:
    """The kernel start time of a live process (zombies count as gone), or None."""
    stat = read_stat(pid)
    if stat is None or stat.state in ("Z", "X"):
        return None
    return stat.start_time


def group_members(pgid: int, *, proc_root: str = "/proc") -> list[ProcStat]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    found: list[ProcStat] = []
    for name in os.listdir(proc_root):
        if not name.isdigit():
            continue
        stat = read_stat(int(name), proc_root=proc_root)
        if stat is not None and stat.pgrp == pgid and stat.state not in ("Z", "X"):
            found.append(stat)
    return found


_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    """This boot's random id (it changes at every boot), or None where /proc does not say.

    Kernel start times count clock ticks since boot, so a (pid, start time) pair names one
    process only within one boot: the boot id completes the identity."""
    try:
        with open(_BOOT_ID, encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


_PROC_STAT = "/proc/stat"


def boot_time(proc_stat: str = _PROC_STAT) -> int | None:
    """When this boot began, in whole epoch seconds (the ``btime`` line of ``/proc/stat``), or
    None where /proc does not say. Stable within one boot, like :func:`boot_id`."""
    try:
        with open(proc_stat, encoding="ascii", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(" ")
                if key == "btime":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None
