"""Cluster wake-ups: LISTEN/NOTIFY with a self-ping, so a silent connection cannot stall a host.

Every board change sends ``NOTIFY dispatch_board`` in its own transaction (see
:class:`dispatcher.cluster.board.PgBoardStore`), so a card added on any host reaches every
listening host as soon as it commits. One :class:`Listener` per host holds one dedicated
connection (outside the pool) in a daemon thread and calls ``on_wake`` for each notification.

A LISTEN connection can go half-open (a NAT or a failover drops it without a FIN) and then
receives nothing, for hours, without an error. So the listener pings its own channel every
``ping_every`` seconds through the *pool* (the path other hosts' notifications take) and
reconnects when the ping has not come back within ``ping_timeout``. The gateway also polls the
board version as a fallback, so a lost notification costs at most one poll interval.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable

import psycopg

from dispatcher.cluster.database import ClusterDB, ClusterError, redact
from scope.foundation.clock import Clock, SystemClock

CHANNEL = "dispatch_board"
log = logging.getLogger("dispatch.cluster")


class Listener:
    """One LISTEN connection with a self-ping (see the module docstring)."""

    def __init__(
        self,
        db: ClusterDB,
        on_wake: Callable[[], None],
        *,
        ping_every: float = 10.0,
        ping_timeout: float = 5.0,
        retry: float = 0.5,
        max_retry: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        self.db = db
        self.on_wake = on_wake
        self.ping_every = ping_every
        self.ping_timeout = ping_timeout
        self.retry = retry
        self.max_retry = max_retry
        self.clock: Clock = clock or SystemClock()
        self.connects = 0
        """How many times the listener (re)connected (1 after a clean start)."""
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._token = ""
        self._pinged_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="dispatch-listen", daemon=True)

    def start(self) -> None:
        """Start listening in the background."""
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop and wait (bounded) for the thread."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        delay = self.retry
        failing = False
        while not self._stop.is_set():
            before = self.connects
            try:
                self._listen_once()
            except (psycopg.Error, OSError, ClusterError) as err:
                if self.connects > before:
                    delay, failing = self.retry, False  # it was listening: a new outage
                if not failing:
                    # Once per outage (the gateway names the outage itself); reconnects are
                    # tried with backoff until the server answers again.
                    log.warning(
                        "cluster wake: no LISTEN connection to %s (%s); retrying with backoff,"
                        " the board is polled meanwhile",
                        redact(self.db.url),
                        _first_line(err),
                    )
                failing = True
            self._stop.wait(delay)
            delay = min(delay * 2, self.max_retry)

    def _listen_once(self) -> None:
        # "dispatch-listen HOST" next to the pool's "dispatch HOST" in pg_stat_activity.
        name = "dispatch-listen" + self.db.application_name.removeprefix("dispatch")
        conn = self.db.connect(autocommit=True, application_name=name)
        try:
            conn.execute(f"LISTEN {CHANNEL}")
            self.connects += 1
            self.connected.set()
            if self.connects > 1:
                log.info("cluster wake: listening again on %s", redact(self.db.url))
            # Something may have changed while we were not listening.
            self.on_wake()
            self._pinged_at = None
            next_ping = self.clock.monotonic() + self.ping_every
            while not self._stop.is_set():
                for note in conn.notifies(timeout=0.5, stop_after=64):
                    self._received(note.payload)
                now = self.clock.monotonic()
                if self._pinged_at is not None and now - self._pinged_at > self.ping_timeout:
                    raise OSError(f"self-ping not returned within {self.ping_timeout:g} s")
                if self._pinged_at is None and now >= next_ping:
                    self._ping()
                    next_ping = now + self.ping_every
        finally:
            self.connected.clear()
            conn.close()

    def _received(self, payload: str) -> None:
        if payload.startswith("ping:"):
            if payload == self._token:
                self._pinged_at = None
            return
        self.on_wake()

    def _ping(self) -> None:
        self._token = "ping:" + secrets.token_hex(8)
        self._pinged_at = self.clock.monotonic()
        with self.db.read() as conn:
            conn.execute("SELECT pg_notify(?, ?)", (CHANNEL, self._token))


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
