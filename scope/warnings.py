"""Warn once per (caller kind, cause): a degraded placement is logged the first time it happens
for a caller kind and reason, not for every worker that is then started the same way."""

from __future__ import annotations

import logging
import threading

__all__ = ["WarnOnce"]

_log = logging.getLogger("dispatch.scope")


class WarnOnce:
    """A thread-safe set of (caller kind, cause) pairs already warned about."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str]] = set()
        self._log = logger or _log

    def warn(self, caller: str, cause: str, message: str) -> bool:
        """Log ``message`` at WARNING unless (caller, cause) was warned about; True if logged."""
        key = (str(caller), cause)
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        self._log.warning("%s", message)
        return True

    def reset(self) -> None:
        """Forget what was warned about (e.g. after scoping recovered, so a relapse is news)."""
        with self._lock:
            self._seen.clear()
