"""The systemd notification protocol (``sd_notify``) over ``$NOTIFY_SOCKET``, without libsystemd.

A ``Type=notify`` service tells the manager it is ready (``READY=1``), what it is doing
(``STATUS=...``), that it is alive (``WATCHDOG=1``, when ``WatchdogSec=`` set ``WATCHDOG_USEC``),
and that it is stopping or reloading. Outside systemd every call is a cheap no-op.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger("dispatch.gateway")


class Notifier:
    """Sends datagrams to the manager's notification socket (if any)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.address = _address(environ.get("NOTIFY_SOCKET", ""))
        self.watchdog_usec = _watchdog_usec(environ)
        self._sock: socket.socket | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        """True when running under a manager that listens for notifications."""
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half the manager's timeout), or None."""
        if not self.watchdog_usec:
            return None
        return self.watchdog_usec / 1_000_000 / 2

    def send(self, **fields: str | int) -> bool:
        """Send ``KEY=value`` lines; returns False (and logs once) when it could not."""
        if self.address is None:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(payload, self.address)
            return True
        except OSError as err:
            if not self._warned:
                log.warning("cannot notify systemd at %s: %s", self.address, err.strerror)
                self._warned = True
            return False

    def ready(self, status: str = "") -> bool:
        """READY=1 (with an optional status line)."""
        return self.send(READY=1, STATUS=status) if status else self.send(READY=1)

    def status(self, text: str) -> bool:
        """STATUS= shown by ``systemctl status``."""
        return self.send(STATUS=text)

    def watchdog(self) -> bool:
        """WATCHDOG=1 keep-alive."""
        return self.send(WATCHDOG=1)

    def stopping(self) -> bool:
        """STOPPING=1 at the start of shutdown."""
        return self.send(STOPPING=1)

    def reloading(self) -> bool:
        """RELOADING=1 while the config is reloaded (READY=1 follows). ``MONOTONIC_USEC`` is
        what ``Type=notify-reload`` (systemd 253+) requires with it; 252 ignores it."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send(RELOADING=1, MONOTONIC_USEC=usec)

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _address(raw: str) -> str | bytes | None:
    if not raw:
        return None
    if raw.startswith("@"):
        # Abstract namespace socket: a leading NUL byte instead of '@'.
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    return None


def _watchdog_usec(environ: Mapping[str, str]) -> int | None:
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = environ.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    return usec if usec > 0 else None
