"""What wakes the cron scheduler: APScheduler, armed at the instant the last step asked for.

:class:`CronWaker` owns the two threads cron needs in a long-running process and nothing else;
every decision stays in :meth:`CronScheduler.step <dispatcher.cron.scheduler.CronScheduler.step>`.

- **Wake-ups**: an APScheduler 3 ``BackgroundScheduler`` gets a one-shot date job at the
  deadline the last step returned, and another whenever an earlier wake is asked for. Each job
  has its own id and is never removed or replaced by us: APScheduler removes a date job itself
  once it ran, and a job replaced or removed under it at that moment is lost (a wake-up gone)
  or raises in its scheduler thread (every later wake-up gone). A job armed for a later time
  than a newer one simply fires into a step with nothing to do. No misfire grace limit:
  APScheduler's default of 1 s would drop a late wake-up, and lateness is judged by the
  scheduler (``cron.on_time_grace``). One step runs at a time: a wake that arrives while a step
  runs is folded into it, and a step that finds itself due again at once steps again.
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

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED

from dispatcher.cron.scheduler import CronScheduler
from registry.errors import StateError

__all__ = ["CronWaker"]

log = logging.getLogger("dispatch.cron")

_WAKE_JOB_PREFIX = "dispatch-cron-wake-"


class _Scheduler(BackgroundScheduler):
    """APScheduler's background scheduler, safe to shut down while a wake job fires.

    After running a date job, APScheduler's thread removes it; if :meth:`shutdown` marked the
    scheduler stopped in between, ``remove_job`` looks only at the pending list and raises in
    that thread. A job that is gone because the scheduler stopped is no error."""

    def remove_job(self, job_id: str, jobstore: str | None = None) -> None:
        try:
            super().remove_job(job_id, jobstore)
        except JobLookupError:
            if self.state != STATE_STOPPED:
                raise


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
        self._armed = 0
        """Wake jobs armed so far (each gets the next number as its id)."""

    @property
    def running(self) -> bool:
        """Whether APScheduler is waking the scheduler."""
        return self._aps is not None

    @property
    def next_wake(self) -> float | None:
        """The clock time of the armed wake-up (None: none armed, or a step is running)."""
        with self._lock:
            pending = self._wake_real is not None and self._wake_real > time.time()
            return self._wake_at if pending and not self._stepping else None

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
            self._aps = _Scheduler(
                timezone=dt.UTC,
                job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 1},
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
            if self._armed_before(real):
                return  # the armed wake comes first
            self._arm(at, real)

    def _armed_before(self, real: float) -> bool:
        """Whether a wake is armed, still to come, and not later than ``real`` (the caller
        holds ``_lock``). A wake whose time has passed has fired or is firing."""
        wake = self._wake_real
        return wake is not None and time.time() < wake <= real

    def _real_time(self, at: float) -> float:
        return time.time() + (at - self.clock.time())

    def _arm(self, at: float, real: float) -> None:
        """Schedule a wake-up job (the caller holds ``_lock``; see the module docstring)."""
        self._wake_at, self._wake_real = at, real
        self._armed += 1
        # Round up to the microsecond so the wake never lands just before the instant.
        run_date = dt.datetime.fromtimestamp(math.ceil(real * 1e6) / 1e6, dt.UTC)
        self._aps.add_job(
            self._on_wake,
            trigger="date",
            run_date=run_date,
            id=f"{_WAKE_JOB_PREFIX}{self._armed}",
        )

    def _on_wake(self) -> None:
        with self._lock:
            if self._stepping:
                # Another wake is stepping now: it steps once more when it ends.
                now = self.clock.time()
                self._rewake = now if self._rewake is None else min(self._rewake, now)
                return
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
                real = self._real_time(at)
                if self._aps is not None and not self._armed_before(real):
                    self._arm(at, real)
                return
