"""What wakes the cron scheduler: APScheduler, armed at the instant the last step asked for.

:class:`CronWaker` owns the two threads cron needs in a long-running process and nothing else;
every decision stays in :meth:`CronScheduler.step <dispatcher.cron.scheduler.CronScheduler.step>`.

- **Wake-ups**: an APScheduler 3 ``BackgroundScheduler`` holds a single one-shot date job at the
  deadline the last step returned. It has no misfire grace limit: APScheduler's default of 1 s
  would drop a late wake-up, and lateness is judged by the scheduler (``cron.on_time_grace``).
  A step that finds itself due again at once (a worker finished meanwhile) steps again on the
  same thread rather than arming a job APScheduler could refuse as a concurrent instance.
- **Early wakes**: the scheduler asks for one when a worker finishes or the settings change, so
  a queued fire or a fire waiting for a concurrency slot starts without delay.
- **Spawn pool**: workers start (and replaced ones are stopped) on a small thread pool handed to
  the scheduler, so fires due together do not wait in line behind one keeper's start-up.

Deadlines are in the scheduler's clock; the wake is armed that far from now on the real clock,
so a fake clock in tests maps onto real APScheduler wake-ups without sleeping to a wall time.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from dispatcher.cron.scheduler import CronScheduler
from registry.errors import StateError

__all__ = ["CronWaker"]

log = logging.getLogger("dispatch.cron")

_WAKE_JOB_ID = "dispatch-cron-wake"


class CronWaker:
    """Runs one :class:`~dispatcher.cron.scheduler.CronScheduler` (see the module docstring)."""

    def __init__(self, scheduler: CronScheduler, *, spawn_threads: int = 4) -> None:
        self.scheduler = scheduler
        self.clock = scheduler.clock
        self.spawn_threads = spawn_threads
        self._lock = threading.Lock()
        self._aps: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._wake_at: float | None = None
        self._wake_real: float | None = None
        self._stepping = False
        self._rewake: float | None = None

    @property
    def running(self) -> bool:
        """Whether APScheduler is waking the scheduler."""
        return self._aps is not None

    @property
    def next_wake(self) -> float | None:
        """The clock time of the armed wake-up (None: none armed, or a step is running)."""
        return self._wake_at

    def start(self) -> None:
        """Catch up (:meth:`CronScheduler.catch_up`), then wake the scheduler whenever it is
        due. Starting a running waker does nothing."""
        with self._lock:
            if self._aps is not None:
                return
        if self._pool is None and self.spawn_threads > 0:
            self._pool = ThreadPoolExecutor(
                max_workers=self.spawn_threads, thread_name_prefix="dispatch-cron-spawn"
            )
            self.scheduler.use_executor(self._pool)
        report = self.scheduler.catch_up()
        with self._lock:
            if self._aps is not None:
                return
            self._aps = BackgroundScheduler(
                timezone=dt.UTC,
                job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 3},
            )
            self._aps.start()
        self.scheduler.on_wake_request(self.request)
        self.request(report.next_wake or self.clock.time())

    def stop(self) -> None:
        """Stop waking, let started spawns finish, then :meth:`CronScheduler.stop` (claimed
        fires not yet started are settled ``failed_start``). Running workers keep running."""
        self.scheduler.on_wake_request(None)
        with self._lock:
            aps, self._aps, self._wake_at, self._wake_real = self._aps, None, None, None
        if aps is not None:
            aps.shutdown(wait=True)
        pool, self._pool = self._pool, None
        self.scheduler.use_executor(None)
        if pool is not None:
            pool.shutdown(wait=True)
        self.scheduler.stop()

    close = stop

    def run(self, stop_event: threading.Event) -> None:
        """:meth:`start`, block until ``stop_event`` is set, then :meth:`stop`."""
        self.start()
        try:
            stop_event.wait()
        finally:
            self.stop()

    def request(self, at: float) -> None:
        """Wake the scheduler at clock time ``at`` or earlier (any thread; a time already
        past wakes it at once)."""
        with self._lock:
            if self._aps is None:
                return
            if self._stepping:
                # The running step re-arms the wake when it ends; fold this request into it.
                self._rewake = at if self._rewake is None else min(self._rewake, at)
                return
            real = self._real_time(at)
            if (
                self._wake_real is not None
                and self._wake_real <= real
                and self._aps.get_job(_WAKE_JOB_ID) is not None
            ):
                return
            self._arm(at, real)

    def _real_time(self, at: float) -> float:
        return time.time() + (at - self.clock.time())

    def _arm(self, at: float, real: float) -> None:
        """Schedule the one wake-up job (the caller holds ``_lock``)."""
        self._wake_at, self._wake_real = at, real
        # Round up to the microsecond so the wake never lands just before the instant.
        run_date = dt.datetime.fromtimestamp(math.ceil(real * 1e6) / 1e6, dt.UTC)
        self._aps.add_job(
            self._on_wake,
            trigger="date",
            run_date=run_date,
            id=_WAKE_JOB_ID,
            replace_existing=True,
        )

    def _on_wake(self) -> None:
        with self._lock:
            self._wake_at = self._wake_real = None
            self._stepping = True
        while True:
            try:
                at = self.scheduler.step(self.clock.time())
            except StateError as err:
                # The ledger cannot be used now (a damaged or unreachable database): one line,
                # not a traceback; the gateway names the problem itself.
                log.error("cron: %s; retrying in %g s", err, self.scheduler.wake_interval)
                at = self.clock.time() + self.scheduler.wake_interval
            except Exception:
                log.exception("cron: tick failed; retrying in %g s", self.scheduler.wake_interval)
                at = self.clock.time() + self.scheduler.wake_interval
            with self._lock:
                if self._rewake is not None:
                    at, self._rewake = min(at, self._rewake), None
                if at <= self.clock.time() and self._aps is not None:
                    continue
                self._stepping = False
                if self._aps is not None and (self._wake_at is None or at < self._wake_at):
                    self._arm(at, self._real_time(at))
                return
