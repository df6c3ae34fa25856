"""The gateway's memory of its last warnings and errors, shown by ``dispatch status``."""

from __future__ import annotations

import collections
import logging
from typing import Any

from scope.foundation.clock import Clock


class RecentErrors(logging.Handler):
    """Keeps the last warnings and errors for ``dispatch status``."""

    def __init__(self, clock: Clock, size: int = 20) -> None:
        super().__init__(level=logging.WARNING)
        self.clock = clock
        self.items: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)

    def forget(self, prefix: str) -> None:
        """Drop the entries whose message starts with ``prefix`` (a problem that is over)."""
        # The handler's own lock: emit() runs under it (logging.Handler.handle), from any thread.
        with self.lock:  # type: ignore[union-attr]
            kept = [item for item in self.items if not item["message"].startswith(prefix)]
            self.items.clear()
            self.items.extend(kept)

    def emit(self, record: logging.LogRecord) -> None:
        self.items.append(
            {
                "at": self.clock.time(),
                "level": record.levelname.lower(),
                "source": record.name.removeprefix("dispatch."),
                "message": record.getMessage(),
            }
        )
