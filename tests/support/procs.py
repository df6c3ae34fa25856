"""Process identity for tests: pid + kernel start time, and signalling only confirmed processes.

A bare pid may have been reused by the time a test looks again. Everything here identifies a
process by ``(pid, start time)`` read from ``/proc/PID/stat`` and signals it through a pidfd opened
*before* the start time is re-checked, so the signal cannot reach a process that took over the pid.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ProcessIdentity",
    "default_signals",
    "identify",
    "is_alive",
    "start_time",
    "stop_child",
    "terminate",
]


@dataclass(frozen=True, kw_only=True)
class ProcessIdentity:
    """A process as the kernel knows it: pid plus start time in clock ticks since boot."""

    pid: int
    start_time: int

    def to_json(self) -> dict[str, int]:
        """Plain dict for a JSON record file."""
        return {"pid": self.pid, "start_time": self.start_time}

    @classmethod
    def from_json(cls, data: dict[str, int]) -> ProcessIdentity:
        """Inverse of :meth:`to_json`."""
        return cls(pid=int(data["pid"]), start_time=int(data["start_time"]))


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name, or None if the process is gone.

    The command name is in parentheses and may itself contain spaces and ')', so split after the
    *last* ')'. The returned list starts at field 3 (state).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data[data.rindex(b")") + 2 :].decode("ascii").split()


def start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (field 22 of /proc/PID/stat), or None if it does not exist."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[22 - 3])


def identify(pid: int) -> ProcessIdentity:
    """Snapshot the identity of a live process; ``ProcessLookupError`` if it does not exist."""
    started = start_time(pid)
    if started is None:
        raise ProcessLookupError(pid, f"no process {pid}")
    return ProcessIdentity(pid=pid, start_time=started)


def is_alive(ident: ProcessIdentity) -> bool:
    """Whether this very process still runs: same pid, same start time, and not a zombie."""
    fields = _stat_fields(ident.pid)
    if fields is None:
        return False
    return fields[0] not in ("Z", "X") and int(fields[22 - 3]) == ident.start_time


def _wait_pidfd(pidfd: int, timeout: float) -> bool:
    """Wait until the process behind ``pidfd`` has exited; True if it did within ``timeout``.

    A pidfd becomes readable when its process exits, for children and non-children alike, so this
    needs no polling loop.
    """
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout * 1000))))


def terminate(ident: ProcessIdentity, *, grace: float = 5.0, kill_after: float = 5.0) -> bool:
    """Stop a process that is not our child: SIGTERM, wait ``grace``, then SIGKILL.

    Signals only when the pid still has the recorded start time, checked after the pidfd is open
    (so the check and the signal refer to the same process). A process that is already gone, or
    whose pid now belongs to someone else, counts as stopped. Returns True when it is gone.
    """
    try:
        pidfd = os.pidfd_open(ident.pid)
    except ProcessLookupError:
        return True
    try:
        if not is_alive(ident):
            return True
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        if _wait_pidfd(pidfd, grace):
            return True
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return _wait_pidfd(pidfd, kill_after)
    finally:
        os.close(pidfd)


def stop_child(proc: subprocess.Popen[Any], *, grace: float = 5.0, kill_after: float = 5.0) -> int:
    """Stop and reap a child we started: SIGTERM, wait ``grace``, SIGKILL, wait ``kill_after``.

    An unreaped child cannot lose its pid to another process, so the Popen object is proof of
    identity. Returns the exit status; raises ``subprocess.TimeoutExpired`` if even SIGKILL did not
    end it within the bound (a process stuck in the kernel), rather than hanging.
    """
    if proc.poll() is not None:
        return proc.returncode
    proc.terminate()
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=kill_after)


def default_signals() -> None:
    """``preexec_fn`` for a child that a test interrupts (Ctrl-C, SIGQUIT): default
    dispositions and an empty mask. Started as a background job (``pytest ... &`` in a script),
    the test process itself runs with SIGINT and SIGQUIT ignored, and a Python child whose
    SIGINT is ignored at start-up never raises KeyboardInterrupt."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
