"""A worker's environment as the registry shapes it (a public face: dispatcher/ imports it).

Spawning takes the caller's environment, leaves out :data:`SERVICE_ENV` and adds
:data:`MARKER_ENV`; the launch core's worker setup leaves the same variables out, and
``dispatch run --env`` refuses to set the marker.
"""

from __future__ import annotations

__all__ = ["MARKER_ENV", "SERVICE_ENV"]

MARKER_ENV = "DISPATCH_SESSION_ID"
"""Set in every worker's environment to its session id; inherited by everything it starts, so
the kill policy finds a double-forked descendant by it (:mod:`registry.proc.identity`)."""

SERVICE_ENV = (
    "INVOCATION_ID",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "JOURNAL_STREAM",
    "MANAGERPID",
    "MAINPID",
    "SYSTEMD_EXEC_PID",
    "TRIGGER_UNIT",
    "TRIGGER_PATH",
    "TRIGGER_TIMER_REALTIME_USEC",
    "TRIGGER_TIMER_MONOTONIC_USEC",
)
"""systemd's per-service variables: a worker that inherited them (from a gateway run as a
service) would believe it is that service (sd_notify to the gateway's socket, socket
activation, a caller "inside a unit"), so spawn never passes them on."""
