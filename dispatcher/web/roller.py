"""Keeps the history's rollup current while ``dispatch web`` runs (:mod:`dispatcher.rollup`).

One daemon thread per process. Every :data:`EVERY` seconds it asks the board store and the cron
ledger to store the answers of the buckets that settled since (nothing to do costs one read;
a settled bucket, one small write transaction). While it catches up (a state upgraded with a
month of history, a dashboard that was stopped for a week) it stores :data:`BATCH` spans at a
time and pauses :data:`PAUSE` seconds between batches, so the gateway's writes never queue
behind it for long. The pages never wait for it: a read counts whatever is not stored yet.
A failure (the database gone for a moment) is logged once and the next round tries again.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

from dispatcher.web.source import Source
from scope.foundation.clock import Clock, SystemClock
from scope.foundation.errors import DispatchError

EVERY = 60.0
"""Seconds between two rounds once the rollup is current (buckets settle a minute after
their end: the newest are a round late at most)."""
PAUSE = 0.1
"""Seconds between two batches while catching up."""
BATCH = 48
"""Spans (two hours of history each) one store rolls up per batch: four days, in write
transactions of :data:`dispatcher.rollup.BUSY` seconds at most (a span at least)."""

_log = logging.getLogger("dispatch.web")


class Roller:
    """The rollup's keeper (see the module docstring)."""

    def __init__(self, source: Source, clock: Clock | None = None) -> None:
        self.source = source
        self.clock = clock or SystemClock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._trouble: str | None = None

    def round(self) -> int:
        """Roll up one batch of the board and one of the ledger; how many answers were stored."""
        now = self.clock.time()
        stored = self.source.store.roll_up(now, spans=BATCH)
        return stored + self.source.ledger().roll_up(now, spans=BATCH)

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dispatch-rollup", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the batch in progress (at most ``timeout`` seconds of waiting)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                stored = self.round()
            except (DispatchError, sqlite3.Error) as err:
                stored = 0
                if str(err) != self._trouble:
                    _log.warning("dispatch web: rolling up the history: %s", err)
                self._trouble = str(err)
            else:
                self._trouble = None
            self._stop.wait(PAUSE if stored else EVERY)
